"""`rljob bench offpolicy JOB.yaml`: what asynchrony does to learning, and what each
`algorithm.offPolicyCorrection` does about it. The job runs in sync (the
reference: every sample on-policy), then in async with maxStaleness 1 and 2 under
each correction (none, tis, mis), one after another on this machine; printed per
run: the mean reward of the last `--last` steps and its difference to sync's, the
mean clipped share, the importance weights' mean, largest value, capped share and
effective sample size, and the engine mismatch (mean |rollout − trainer log-prob|
of the fresh samples' tokens). `--temperature` / `--top-p` override the job's
sampling settings, so the same comparison runs at the settings a recipe uses.

Rewards of async runs vary from run to run (which weights made which sample
depends on timing), so a difference to sync below the run-to-run spread means
nothing; `--seeds` repeats each configuration with other seeds and prints means."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from rljob.api import RLJob
from rljob.local import LocalRun

CORRECTIONS = ("none", "tis", "mis")
FIGURES = ("clip", "is_weight_mean", "is_capped", "is_ess", "logp_mismatch_mean")


def configurations(corrections=CORRECTIONS) -> list[tuple[str, int | None, str]]:
    """(mode, maxStaleness, offPolicyCorrection) of each run, sync first (pure)."""
    return [("sync", None, "none")] + [("async", k, c) for k in (1, 2) for c in corrections]


def variant(job: RLJob, mode: str, k: int | None, correction: str, steps: int | None,
            seed: int, temperature: float | None, top_p: float | None) -> RLJob:
    """The job in one configuration (pure)."""
    doc = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec = doc["spec"]
    spec["workflow"] = {k_: v for k_, v in spec.get("workflow", {}).items()
                        if k_ not in ("maxStaleness", "mode")} | {"mode": mode}
    if k is not None:
        spec["workflow"]["maxStaleness"] = k
    algo = spec.setdefault("algorithm", {})
    algo["offPolicyCorrection"] = correction
    if correction == "none":
        algo.pop("importanceCap", None)
    algo["seed"] = seed
    if steps is not None:
        algo["maxSteps"] = steps
    rollout = spec.setdefault("rollout", {})
    if temperature is not None:
        rollout["temperature"] = temperature
    if top_p is not None:
        rollout["topP"] = top_p
    return RLJob.model_validate(doc)


def summarise(metrics: list[dict], last: int) -> dict:
    """A run's figures from its metrics.jsonl lines (pure)."""
    tail = metrics[-last:]
    out = {"steps": len(metrics), "reward_last": statistics.fmean(m["reward_mean"] for m in tail)}
    for key in FIGURES:
        values = [m[key] for m in metrics if m.get(key) is not None]
        out[key] = statistics.fmean(values) if values else None
    weights = [m["is_weight_max"] for m in metrics if m.get("is_weight_max") is not None]
    out["is_weight_max"] = max(weights) if weights else None
    return out


def run(job: RLJob, label: str, steps: int | None = None, last: int = 30, seeds: int = 1,
        temperature: float | None = None, top_p: float | None = None,
        corrections=CORRECTIONS, keep: Path | None = None, progress=None) -> dict:
    """`job` with its paths resolved (as `rljob run` reads them), named `label`."""
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="rljob-bench-offpolicy-") as tmp:
        root = keep or Path(tmp)
        for mode, k, correction in configurations(corrections):
            name = "sync" if k is None else f"async({k}) {correction}"
            runs = []
            for seed in range(seeds):
                spec_job = variant(job, mode, k, correction, steps, job.spec.algorithm.seed
                                   + seed, temperature, top_p)
                directory = root / f"{name.replace(' ', '-')}-{seed}"
                local = LocalRun(spec_job, directory)
                local.run_to_end(poll=0.5)
                runs.append(summarise(local.metrics(), last))
                if progress:
                    progress(f"{name} seed {seed}: reward of the last {last} steps "
                             f"{runs[-1]['reward_last']:.3f}")
            results[name] = {key: _mean([r[key] for r in runs]) for key in runs[0]}
    sync = results["sync"]["reward_last"]
    for r in results.values():
        r["reward_vs_sync"] = r["reward_last"] - sync
    sampling = job.spec.rollout
    return {"job": label, "last": last, "seeds": seeds,
            "temperature": temperature or sampling.temperature,
            "top_p": top_p or sampling.top_p, "runs": results}


def _mean(values: list):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{results['job']} · temperature {results['temperature']} · top-p "
              f"{results['top_p']} · {results['seeds']} seed(s) · reward: mean of the last "
              f"{results['last']} steps")
    columns = ("run", "reward", "vs sync", "clipped", "IS w mean", "IS w max", "capped",
               "ESS", "mismatch")
    for c in columns:
        t.add_column(c, justify="right")
    num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for name, r in results["runs"].items():
        t.add_row(name, num(r["reward_last"], ".3f"), num(r["reward_vs_sync"], "+.3f"),
                  num(r["clip"], ".3f"), num(r["is_weight_mean"], ".3f"),
                  num(r["is_weight_max"], ".2f"), num(r["is_capped"], ".4f"),
                  num(r["is_ess"], ".3f"), num(r["logp_mismatch_mean"], ".2e"))
    Console().print(t)
