#!/usr/bin/env bash
# The accelerator paths in one call, on a machine with one NVIDIA GPU and no
# internet (run from the repository root; wheels the machine lacks in .whl/, as
# scripts/gpu-bench.sh takes them; vLLM's wheel is too large to carry: the rollout
# uses the hf engine). It fails loudly on the first error and prints figures:
#   1. the trainer engines (torch, megatron at tp 1) on Qwen2-0.5B's shapes:
#      scripts/gpu-bench.sh (step seconds, tokens/s);
#   2. weights from a trainer to a rollout process: `rljob bench weights` (grpc and
#      gloo, the host paths a one-GPU job uses: NCCL and HCCL refuse two ranks on one
#      device, so the collective transport needs a second device);
#   3. `rljob run` of the quickstart with accelerator.type gpu, 20 RL steps, once with
#      each trainer engine (trainer and rollout share the one device, weights over
#      grpc): step time, tokens/s, weight-sync seconds, reward per 10 steps, from its
#      metrics.jsonl.
# Output under $OUT (./gpu-check-out): trainer.*, weights.json, run-ENGINE/ and
# summary.txt.
#
# Overrides, to try the script's logic on a machine without a GPU:
# RLJOB_CHECK_ACCEL (gpu) cpu, RLJOB_CHECK_STEPS (20), RLJOB_CHECK_ENGINES ("torch
# megatron" on gpu, "torch" on cpu: megatron needs an accelerator), RLJOB_BENCH_*
# (gpu-bench.sh's).
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

echo "== 1/3 trainer engines ($accel)"
RLJOB_BENCH_ACCEL=$accel OUT=$OUT bash scripts/gpu-bench.sh
site=${RLJOB_BENCH_SITE:-/tmp/site}
export PYTHONPATH="$site:$PWD/runtime:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

echo "== 2/3 weights, trainer to a rollout process"
python3 -m rljob bench weights --rounds 3 --json > "$OUT/weights.json" 2> "$OUT/weights.stderr" \
    || { tail -50 "$OUT/weights.stderr"; exit 1; }
python3 -c 'import json, sys; from rljob_bench import weights; weights.render(json.load(open(sys.argv[1])))' \
    "$OUT/weights.json" | tee "$OUT/weights.txt"

for engine in $engines; do
echo "== 3/3 rljob run, accelerator.type $accel, trainer.engine $engine, $steps RL steps"
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
python3 -m rljob run "$OUT/job-$engine.yaml" --run-dir "$run" 2>&1 | tee "$OUT/run-$engine.txt" | tail -5
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
done
