#!/usr/bin/env bash
# The accelerator paths in one call, on a machine with one NVIDIA GPU and no
# internet (run from the repository root; wheels the machine lacks in .whl/, as
# scripts/gpu-bench.sh takes them; vLLM's wheel is too large to carry: the rollout
# uses the hf engine). It fails loudly on the first error and prints figures. Parts
# (RLJOB_CHECK_PARTS, default all four, in this order):
#   peer: `rljob bench peer`: one GRPO job (Qwen2-0.5B's layers, random init,
#      bfloat16 passes and float32 masters, 16 prompts x 8 samples of up to 128 new
#      tokens a step) by `rljob run` in sync and async(1) and by TRL's GRPOTrainer
#      configured for the job, side by side: tokens/s, step seconds, Tgen, Ttrain,
#      async's bound, ratios to TRL, where a step goes;
#   trainer: the trainer engines (torch, megatron at tp 1) on Qwen2-0.5B's shapes:
#      scripts/gpu-bench.sh (step seconds, tokens/s);
#   weights: weights from a trainer to a rollout process: `rljob bench weights` (grpc
#      and gloo, the host paths a one-GPU job uses: NCCL and HCCL refuse two ranks on
#      one device, so the collective transport needs a second device);
#   run: `rljob run` of the quickstart with accelerator.type gpu, 20 RL steps, once
#      with each trainer engine (trainer and rollout share the one device, weights
#      over grpc): step time, tokens/s, weight-sync seconds, reward per 10 steps,
#      from its metrics.jsonl; and torch's profiler over three of its steps in the
#      trainer and a replica (`--torch-profile`): each one's host and device time a
#      step, its copies between host and device and its waits for the device.
# The wheels it needs beyond the machine's image (torch, transformers, accelerate,
# pyarrow, pandas, grpcio's image version are used as they are there): pydantic,
# pydantic-core, annotated-types, typing-inspection, protobuf, grpcio,
# grpcio-health-checking, redis, hiredis, megatron-core (trainer), trl, datasets,
# dill, multiprocess (peer): the versions of this repository's .venv, cp312 manylinux.
# Output under $OUT (./gpu-check-out): peer.* and peer-runs/ (each run's directory),
# trainer.*, weights.json, run-ENGINE/ (its profiles/ too), profile-ENGINE.txt and
# summary.txt.
#
# Overrides, to try the script's logic on a machine without a GPU:
# RLJOB_CHECK_ACCEL (gpu) cpu (the tiny model and a small job in the peer part),
# RLJOB_CHECK_PARTS ("peer trainer weights run"), RLJOB_CHECK_STEPS (20; the peer
# part's: RLJOB_CHECK_PEER_STEPS, 8), RLJOB_CHECK_ENGINES ("torch megatron" on gpu,
# "torch" on cpu: megatron needs an accelerator), RLJOB_BENCH_* (gpu-bench.sh's).
set -euo pipefail
cd "$(dirname "$0")/.."

accel=${RLJOB_CHECK_ACCEL:-gpu}
steps=${RLJOB_CHECK_STEPS:-20}
if [[ $accel == cpu ]]; then default_engines=torch; else default_engines="torch megatron"; fi
engines=${RLJOB_CHECK_ENGINES:-$default_engines}
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
rm -f "$OUT/summary.txt"
began=$SECONDS

parts=" ${RLJOB_CHECK_PARTS:-peer trainer weights run} "
site=${RLJOB_BENCH_SITE:-/tmp/site}
shopt -s nullglob
wheels=("${RLJOB_BENCH_WHEELS:-.whl}"/*.whl)
if (( ${#wheels[@]} )); then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "${wheels[@]}"
fi
export PYTHONPATH="$site:$PWD/runtime:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{
    if [[ $accel == gpu ]]; then nvidia-smi -L; fi
    python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "transformers", transformers.__version__)'
    python3 -c 'import trl, datasets, accelerate, pyarrow; print("trl", trl.__version__, "datasets", datasets.__version__, "accelerate", accelerate.__version__, "pyarrow", pyarrow.__version__)' || true
} 2>&1 | tee "$OUT/versions.txt"

if [[ $parts == *" peer "* ]]; then
echo "== peer: rljob run (sync, async(1)) and TRL on one job ($accel)"
if [[ $accel == cpu ]]; then
    peer_args=(--model tiny --prompts 2 --group 8 --max-new-tokens 22 --micro-batch 8)
else
    peer_args=(--model qwen2-0.5b --prompts 16 --group 8 --max-new-tokens 128 --micro-batch 16)
fi
peer_steps=${RLJOB_CHECK_PEER_STEPS:-8}
rm -rf "$OUT/peer-runs"  # each run's directory (spans, timeline.png, logs) is kept
python3 -m rljob bench peer --accelerator "$accel" "${peer_args[@]}" --steps "$peer_steps" \
    --warmup 3 --keep "$OUT/peer-runs" --json > "$OUT/peer.json" 2> "$OUT/peer.stderr" \
    || { tail -50 "$OUT/peer.stderr"; exit 1; }
python3 -c 'import json, sys; from rljob_bench import peer; peer.render(json.load(open(sys.argv[1])))' \
    "$OUT/peer.json" | tee "$OUT/peer.txt"
fi

if [[ $parts == *" trainer "* ]]; then
echo "== trainer engines ($accel)"
RLJOB_BENCH_ACCEL=$accel RLJOB_BENCH_WHEELS=none OUT=$OUT bash scripts/gpu-bench.sh
fi

if [[ $parts == *" weights "* ]]; then
echo "== weights, trainer to a rollout process"
python3 -m rljob bench weights --rounds 3 --json > "$OUT/weights.json" 2> "$OUT/weights.stderr" \
    || { tail -50 "$OUT/weights.stderr"; exit 1; }
python3 -c 'import json, sys; from rljob_bench import weights; weights.render(json.load(open(sys.argv[1])))' \
    "$OUT/weights.json" | tee "$OUT/weights.txt"
fi

[[ $parts == *" run "* ]] || engines=""
for engine in $engines; do
echo "== rljob run, accelerator.type $accel, trainer.engine $engine, $steps RL steps"
python3 - "$accel" "$steps" "$engine" "$OUT/job-$engine.yaml" <<'PY'
import sys
from pathlib import Path

import yaml

accel, steps, engine, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
doc = yaml.safe_load(Path("examples/quickstart.yaml").read_text())
spec = doc["spec"]
spec["model"]["path"] = f"random:{Path('examples/models/tiny-qwen2').resolve()}"
spec["dataset"]["path"] = str(Path("examples/data/arith.jsonl").resolve())
spec["model"]["warmupSteps"] = 20
spec["algorithm"]["maxSteps"] = steps
spec["accelerator"] = {"type": accel}
spec["rollout"]["replicas"] = 1
spec.setdefault("trainer", {})["engine"] = engine
spec.setdefault("workflow", {})["weightTransport"] = "grpc"  # one device: no collective
out.write_text(yaml.safe_dump(doc))
PY
run=$OUT/run-$engine
rm -rf "$run"
# torch's profiler over three steps past the middle (run-ENGINE/profiles/: traces, tables)
pfirst=$(( steps / 2 > 2 ? steps / 2 : 2 )); plast=$(( pfirst + 2 < steps - 1 ? pfirst + 2 : steps - 1 ))
(( plast >= pfirst )) || plast=$pfirst
python3 -m rljob run "$OUT/job-$engine.yaml" --run-dir "$run" --torch-profile "$pfirst-$plast" \
    2>&1 | tee "$OUT/run-$engine.txt" | tail -5
python3 - "$run" "$accel" "$engine" "$((SECONDS - began))" <<'PY' | tee -a "$OUT/summary.txt"
import json, statistics, sys
from pathlib import Path

from rljob.infra.timeline import load_spans

run, accel, engine, seconds = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
ms = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
if not ms or not (run / "final" / "model.safetensors").exists():
    sys.exit(f"rljob run on {accel} ({engine}) made {len(ms)} steps and no final weights")
steady = ms[3:] or ms
step = (steady[-1]["time"] - steady[0]["time"]) / max(len(steady) - 1, 1)
sync = [s.end - s.start for s in load_spans(run) if s.kind == "weight-sync" and s.step >= 0
        and s.worker == "trainer-0"]
rewards = ", ".join(f"{statistics.mean(m['reward_mean'] for m in ms[i:i + 10]):.3f}"
                    for i in range(0, len(ms), 10))
print(f"rljob run on {accel}, trainer.engine {engine}: {len(ms)} steps; steady step {step:.3f} s, "
      f"{statistics.median(m['tokens_per_second'] for m in steady):.0f} tokens/s, "
      f"Tgen {statistics.median(m['gen_seconds'] for m in steady):.3f} s, "
      f"Ttrain {statistics.median(m['train_seconds'] for m in steady):.3f} s, "
      f"weight publish {statistics.median(sync) if sync else float('nan'):.3f} s; "
      f"mean reward per 10 steps {rewards}; the check so far {seconds} s")
PY
python3 - "$run" "$engine" <<'PY' | tee "$OUT/profile-$engine.txt" | tee -a "$OUT/summary.txt"
import json, re, sys
from pathlib import Path

run, engine = Path(sys.argv[1]), sys.argv[2]
# host-device copies and the host's waits for the device, by the names torch and CUDA give them
MOVES = re.compile(r"memcpy|synchroniz|_local_scalar_dense|aten::copy_|aten::to$|aten::_to_copy",
                   re.I)
for worker in ("trainer-0", "rollout-0"):
    path = run / "profiles" / f"{worker}.summary.json"
    if not path.exists():
        sys.exit(f"{worker} wrote no torch profile ({path})")
    p = json.loads(path.read_text())
    n = max(p["steps"], 1)
    ms = lambda us: us / 1e3 / n  # noqa: E731
    moves = {k: o for k, o in p["ops"].items() if MOVES.search(k)}
    print(f"torch profile, {engine} engine, {worker}, steps {p['steps_recorded']}: "
          f"{p['wall_ms_per_step']:.1f} ms a step recorded, its ops' own time "
          f"{p['self_cpu_ms_per_step']:.1f} ms on the host, "
          f"{p['self_device_ms_per_step']:.1f} ms on the device")
    print("  copies and waits, ms a step (host, device; calls): " + (", ".join(
        f"{k} {ms(o['self_cpu_us']):.2f}, {ms(o['self_device_us']):.2f} "
        f"({o['calls'] // n})" for k, o in list(moves.items())[:8]) or "none"))
    print("  the most time, ms a step (host, device): " + ", ".join(
        f"{k} {ms(o['self_cpu_us']):.2f}, {ms(o['self_device_us']):.2f}"
        for k, o in list(p["ops"].items())[:6]))
PY
done
