#!/usr/bin/env bash
# Prints the path of the pinned uv, the locks' resolver and installer (locks/README.md).
# It is installed from PyPI once, into ~/.cache/rljob/uv-VERSION; callers that run at
# the same time (the test command's set-up builds two environments at once) wait for
# the first one's install.
set -euo pipefail
UV_VERSION=0.13.9
python="${PYTHON:-python3}"
root="${RLJOB_CACHE:-$HOME/.cache/rljob}/uv-$UV_VERSION"
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock 9
if [[ ! -x "$root/bin/uv" ]]; then
  rm -rf "$root"
  "$python" -m venv "$root"
  "$root/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION" >&2
fi
echo "$root/bin/uv"
