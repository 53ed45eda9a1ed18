#!/usr/bin/env bash
# `rljob bench trainer` on a machine with one NVIDIA GPU and no internet: the
# torch and megatron trainer engines' GRPO step on Qwen2-0.5B's shapes (random
# init, bfloat16 passes), side by side. Run from the repository root; the
# dependencies the machine lacks come as wheels in .whl/ (pip download, cp312
# manylinux) and are installed to /tmp/site, the repository's source is used as is.
# Output: $OUT/trainer.txt (the table) and $OUT/trainer.json.
#
# Overrides (to try the script's logic elsewhere, e.g. on CPU with the tiny
# model): RLJOB_BENCH_ACCEL (gpu), RLJOB_BENCH_MODEL (qwen2-0.5b),
# RLJOB_BENCH_ENGINES (torch,megatron), RLJOB_BENCH_ARGS (the sizes below),
# RLJOB_BENCH_WHEELS (.whl: none to install when it has none), RLJOB_BENCH_SITE
# (/tmp/site), OUT (./bench-out).
set -euo pipefail
cd "$(dirname "$0")/.."

accel=${RLJOB_BENCH_ACCEL:-gpu}
model=${RLJOB_BENCH_MODEL:-qwen2-0.5b}
engines=${RLJOB_BENCH_ENGINES:-torch,megatron}
# 4 prompts x 8 samples of 128 + 512 tokens a step (20480 tokens), in 4 micro-batches of 8
sizes=${RLJOB_BENCH_ARGS:---group 8 --prompt-len 128 --response-len 512 --micro-batch 8 --micro-batches 4 --warmup 3 --steps 10}
site=${RLJOB_BENCH_SITE:-/tmp/site}
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"

shopt -s nullglob
wheels=("${RLJOB_BENCH_WHEELS:-.whl}"/*.whl)
if (( ${#wheels[@]} )); then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "${wheels[@]}"
fi
export PYTHONPATH="$site:$PWD/runtime:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS=ignore  # mcore warns, at import, of every optional package it lacks
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

{
    echo "# $(date -u +%FT%TZ) rljob bench trainer --accelerator $accel --model $model --engines $engines $sizes"
    if [[ $accel == gpu ]]; then nvidia-smi -L; fi
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
    python3 -c 'import megatron.core as m; print("megatron-core", m.__version__)' || true
} 2>&1 | tee "$OUT/env.txt"

# shellcheck disable=SC2086  # $sizes: several options
python3 -m rljob bench trainer --accelerator "$accel" --model "$model" --engines "$engines" \
    $sizes --json > "$OUT/trainer.json" 2> "$OUT/trainer.stderr" \
    || { tail -50 "$OUT/trainer.stderr"; exit 1; }
# the table, from the same results
python3 -c 'import json, sys; from rljob_bench import trainer; trainer.render(json.load(open(sys.argv[1])))' \
    "$OUT/trainer.json" | tee "$OUT/trainer.txt"
python3 - "$OUT/trainer.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
bad = {n: e["error"] for n, e in res["engines"].items() if "error" in e}
sys.exit(f"engines that failed: {bad}" if bad else 0)
PY
