"""`rljob bench calibration`: does the planner, fed with a live profile of a job,
predict the job's step time? The bench workflow job (the quickstart's model and
data, 16 prompts × 16 samples, up to 22 tokens; `bench/workflow.py`) runs for real
in sync, periodic and async(1); each run's live profile (`planner/live.py`: its
engine's decode steps by batch size and prefill, its trainer's tokens/s, its
steps' response lengths) feeds `rljob simulate`'s model of every mode. Printed per
mode: the measured seconds a step (steady state), the predicted ones from the sync
run's profile (each side measured alone) and from the mode's own run's (each side
measured beside the other on a shared machine), and their errors; and Tgen / Ttrain
as measured in sync against the cost model's."""

from __future__ import annotations

import tempfile
from pathlib import Path

MODES = (("sync", None), ("periodic", None), ("async", 1))


def _name(mode: str, k: int | None) -> str:
    return mode if k is None else f"{mode}-{k}"


def run(steps: int = 12, keep: Path | None = None, warmup_steps: int = 3) -> dict:
    from rljob.planner.job import job_model, pipeline_config
    from rljob.planner.live import profile_from_run
    from rljob.planner.simulator import simulate
    from .workflow import bench_job, run_mode

    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="rljob-calibration-"))
    measured, profiles, specs = {}, {}, {}
    for mode, k in MODES:
        name = _name(mode, k)
        measured[name] = run_mode(mode, k, steps, root, warmup_steps)
        specs[name] = bench_job(mode, k, steps, root).spec
        profiles[name] = profile_from_run(root / name, specs[name], skip_steps=warmup_steps)
    rows = []
    for mode, k in MODES:
        name = _name(mode, k)
        row = {"mode": name, "measured_step_seconds": measured[name]["step_seconds"]}
        for key, source in (("sync_profile", "sync"), ("own_profile", name)):
            model = job_model(specs[name], profiles[source])
            sim = simulate(pipeline_config(model, mode, mode != "sync", steps))
            row[f"predicted_{key}"] = sim.step_seconds
            row[f"error_{key}"] = sim.step_seconds / row["measured_step_seconds"] - 1
        rows.append(row)
    sync_model = job_model(specs["sync"], profiles["sync"])
    sides = {"measured_gen_seconds": measured["sync"]["gen_seconds"],
             "model_gen_seconds": sync_model.tgen(1),
             "measured_train_seconds": measured["sync"]["train_seconds"],
             "model_train_seconds": sync_model.ttrain(1)}
    prof = profiles["sync"]
    return {"steps": steps, "warmup_steps": warmup_steps, "rows": rows, "sync_sides": sides,
            "sync_profile": {"batch_sizes": prof.gen.batch_sizes,
                             "ptl_seconds": prof.gen.ptl_seconds,
                             "prefill_per_token": prof.gen.prefill_per_token,
                             "train_tokens_per_second": prof.train.tokens_per_second[0],
                             "responses": len(prof.output_lengths)}}


def render(results: dict) -> None:
    print(f"the bench workflow job, {results['steps']} steps ({results['warmup_steps']} left "
          "out): measured seconds a step against the simulator's, fed with a live profile")
    print(f"  {'mode':<10} {'measured':>9} {'sync profile':>13} {'error':>7} "
          f"{'own profile':>12} {'error':>7}")
    for r in results["rows"]:
        print(f"  {r['mode']:<10} {r['measured_step_seconds']:>8.3f}s "
              f"{r['predicted_sync_profile']:>12.3f}s {r['error_sync_profile']:>+7.0%} "
              f"{r['predicted_own_profile']:>11.3f}s {r['error_own_profile']:>+7.0%}")
    s = results["sync_sides"]
    print(f"  sync's sides: Tgen {s['measured_gen_seconds']:.3f} s measured, "
          f"{s['model_gen_seconds']:.3f} s modelled; Ttrain {s['measured_train_seconds']:.3f}"
          f" s measured, {s['model_train_seconds']:.3f} s modelled")
    p = results["sync_profile"]
    print("  sync's live profile: decode step " + ", ".join(
        f"{b:g} rows {t * 1e3:.2f} ms" for b, t in zip(p["batch_sizes"], p["ptl_seconds"]))
        + f"; prefill {p['prefill_per_token'] * 1e6:.1f} us/token; trainer "
        f"{p['train_tokens_per_second']:.0f} tokens/s; {p['responses']} responses")
