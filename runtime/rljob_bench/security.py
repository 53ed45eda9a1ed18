"""`rljob bench security`: what the job's credentials cost. The quickstart job (the
examples' tiny Qwen2 on CPU, async(1)) runs through `rljob run` with its credentials
off (no job token, `transferQueue.tls: false`) and on (the token on every gRPC call,
TLS on every connection), both from one policy warmed up once, the two alternating
round by round so that a machine's drift falls on both; printed: each side's steady
tokens/s, step seconds and the controller's CPU a step (medians of the rounds), and
the ratio on/off. Then the TransferQueue alone at 64 KB rows (one producer, one
consumer, through a Redis unit as the operator runs it): put+get MB/s and the claim
latency of 8 consumers with no credentials, with the token, and with the token and TLS
(Redis's too)."""

from __future__ import annotations

import os
import statistics
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from rljob.api import RLJob
from rljob.api.validation import load_rljob
from rljob.preflight import resolve_paths
from rljob.contract import TLS_CA_ENV, TOKEN_ENV

from .examples import example, warmed
from .workflow import measure

SIDES = ("off", "on")
FIGURES = ("tokens_per_s", "step_seconds", "controller_cpu_ms")


QUICK_WARMUP_STEPS = 20  # --quick: the policy's supervised warm-up, before any step


def security_job(steps: int, tls: bool, quick: bool = False, model: dict | None = None
                 ) -> RLJob:
    """The quickstart with `steps` steps and `transferQueue.tls` `tls`, its relative
    paths read from the examples' folder as `rljob run` reads them; `quick`: a tenth
    of its supervised warm-up (before the steps measured: both sides alike); `model`:
    settings of spec.model replaced (the warmed policy every run starts from)."""
    path = example("quickstart.yaml")
    job = resolve_paths(load_rljob(str(path)), path.parent)
    job.spec.algorithm.max_steps = steps
    job.spec.transfer_queue.tls = tls
    if quick:
        job.spec.model.warmup_steps = min(job.spec.model.warmup_steps, QUICK_WARMUP_STEPS)
    if model:
        doc = job.model_dump(mode="json", by_alias=True, exclude_none=True)
        doc["spec"]["model"] |= model
        job = RLJob.model_validate(doc)
    return job


def job_cost(steps: int, warmup: int, rounds: int, root: Path, quick: bool = False) -> dict:
    """Each side's figures (medians of `rounds` alternate runs) and on/off ratios."""
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    # every run starts from one policy, warmed up once here
    model = warmed(security_job(steps, False, quick), root / "warmed")
    for r in range(rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            on = side == "on"
            m = measure(security_job(steps, on, quick, model), root / f"round-{r}" / side,
                        warmup, token=None if on else "")
            runs[side].append({
                "tokens_per_s": m["tokens_per_s"], "step_seconds": m["step_seconds"],
                "controller_cpu_ms": 1e3 * m["cpu_seconds"].get("transferqueue", 0.0),
                "cpu_ms": {w: 1e3 * s for w, s in m["cpu_seconds"].items()}})
    out: dict = {side: {k: statistics.median(x[k] for x in runs[side]) for k in FIGURES}
                 for side in SIDES}
    for side in SIDES:  # each process's CPU a step: whose work the credentials add to
        workers = sorted({w for x in runs[side] for w in x["cpu_ms"]})
        out[side]["cpu_ms"] = {w: statistics.median(x["cpu_ms"].get(w, 0.0) for x in runs[side])
                               for w in workers}
    out["ratio_on_to_off"] = {k: out["on"][k] / out["off"][k] for k in FIGURES
                              if out["off"][k]}
    out["rounds"] = rounds
    return out


@contextmanager
def _as_client(token: str | None, ca: str | None):
    """This process and the consumers it spawns present `token` and trust `ca`."""
    before = {k: os.environ.pop(k, None) for k in (TOKEN_ENV, TLS_CA_ENV)}
    os.environ.update({k: v for k, v in ((TOKEN_ENV, token), (TLS_CA_ENV, ca)) if v})
    try:
        yield
    finally:
        for k, v in before.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def tq_cost(quick: bool, rounds: int = 2) -> dict:
    """64 KB put+get MB/s (1 consumer) and claim p50 of 8 consumers, medians of
    `rounds` alternate runs, against three controllers of one job: no credentials,
    the token, the token and TLS (its Redis unit on TLS too)."""
    from rljob.infra import tls
    from rljob.infra.auth import new_token

    from .transferqueue import (BYTES_PER_CASE, ROWS_PER_BATCH, _percentile, _start_controller,
                                _start_redis, claim_latency, tq_put_get)

    password, token, pems = "bench-" + new_token()[:16], new_token(), tls.make()
    size = 64 << 10
    batches = max(BYTES_PER_CASE // (8 if quick else 1) // 4 // (size * ROWS_PER_BATCH), 4)
    runs: dict[str, dict[str, list[float]]] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rljob-bench-tls-")))
        plain_url, tls_url = _start_redis(stack, password), _start_redis(stack, password,
                                                                          pems, tmp)
        sides = {
            "off": (_start_controller(stack, plain_url, password, job="sec-off"), None, None),
            "token": (_start_controller(stack, plain_url, password, token, job="sec-token"),
                      token, None),
            "token+tls": (_start_controller(stack, tls_url, password, token, job="sec-tls",
                                            env=pems.env()), token, pems.ca)}
        for r in range(rounds):
            for side, (address, presented, ca) in sides.items():
                with _as_client(presented, ca):
                    mbs = tq_put_get(address, password, size, batches, 1, f"sec-{side}-{r}")
                    lat = claim_latency(address, password, claims=20 if quick else 60)
                figures = runs.setdefault(side, {})
                figures.setdefault("put_get_64KB_MBps", []).append(mbs)
                figures.setdefault("claim_p50_ms", []).append(_percentile(lat, 50) * 1e3)
    out: dict = {side: {k: float(np.median(v)) for k, v in figures.items()}
                 for side, figures in runs.items()}
    out["ratio_to_off"] = {side: {k: out[side][k] / out["off"][k] for k in out[side]}
                           for side in ("token", "token+tls")}
    return out


def run(steps: int = 24, warmup: int = 4, rounds: int = 2, keep: Path | None = None,
        quick: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="rljob-bench-security-") as tmp:
        job = job_cost(steps, warmup, rounds, keep or Path(tmp), quick)
    return {"job": job, "transferqueue": tq_cost(quick, rounds=1 if quick else 2)}


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    job = results["job"]
    table = Table(title=f"the quickstart, credentials off and on (medians of "
                        f"{job['rounds']} alternate rounds)")
    for col in ("", "tokens/s", "step s", "controller CPU ms a step"):
        table.add_column(col, justify="right")
    for side in SIDES:
        f = job[side]
        table.add_row(side, f"{f['tokens_per_s']:.0f}", f"{f['step_seconds']:.3f}",
                      f"{f['controller_cpu_ms']:.1f}")
    ratio = job["ratio_on_to_off"]
    table.add_row("on / off", *(f"{ratio[k]:.3f}" if k in ratio else "n/a" for k in FIGURES))
    console = Console(width=max(Console().width, 100))
    console.print(table)
    cpu = {side: job[side].get("cpu_ms", {}) for side in SIDES}
    if cpu["off"]:
        console.print("CPU ms a step, off -> on: " + ", ".join(
            f"{w} {cpu['off'][w]:.1f} -> {cpu['on'].get(w, 0.0):.1f}" for w in cpu["off"]))
    tq = results["transferqueue"]
    tq_table = Table(title="TransferQueue, 64 KB rows through a Redis unit")
    for col in ("", "put+get MB/s", "claim p50 ms (8 consumers)"):
        tq_table.add_column(col, justify="right")
    for side in ("off", "token", "token+tls"):
        f = tq[side]
        extra = (f" ({tq['ratio_to_off'][side]['put_get_64KB_MBps']:.3f}x)"
                 if side != "off" else "")
        lat = (f" ({tq['ratio_to_off'][side]['claim_p50_ms']:.3f}x)" if side != "off" else "")
        tq_table.add_row(side, f"{f['put_get_64KB_MBps']:.0f}{extra}",
                         f"{f['claim_p50_ms']:.2f}{lat}")
    console.print(tq_table)
