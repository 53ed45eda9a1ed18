#!/usr/bin/env bash
# Refreshes the locks (locks/README.md) and runs the test command on them, so that an
# upgrade is a change of its own with its own CI run:
#   locks/test.txt   the test command's .venv: rljob[operator,dev,bench,lora] (pyproject.toml's
#                    ranges), for every platform and Python >= 3.11; the CPU runtime and
#                    operator images install with it as pip's constraints
#   locks/vllm.txt   the vLLM tier's environment (tests/vllm/setup.sh --lock)
#   locks/mcp1.txt   an MCP server's own environment on the 1.x SDK (locks/mcp1.in), which
#                    the MCP tests run against the 2.x client
# then regenerates the gRPC code (runtime/rljob/*/proto) with the locked grpcio-tools.
#
#   bash scripts/lock.sh                     # pyproject.toml changed: pins kept where they fit
#   bash scripts/lock.sh --upgrade           # everything to the newest the ranges allow
#   bash scripts/lock.sh --upgrade-package torch
#   bash scripts/lock.sh --no-test ...       # the locks and the code only
# Arguments other than --no-test go to `uv pip compile`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
test=1
args=()
for a in "$@"; do
  if [[ "$a" == "--no-test" ]]; then test=0; else args+=("$a"); fi
done
uv=$(bash scripts/uv.sh)

"$uv" pip compile -q --universal --python-version 3.11 --no-header --annotation-style line \
  --extra operator --extra dev --extra bench --extra lora "${args[@]}" -o locks/test.txt pyproject.toml
{ echo "# The test command's environment: rljob[operator,dev,bench,lora] from pyproject.toml's ranges,"
  echo "# every platform, Python >= 3.11. Written by scripts/lock.sh; do not edit."
  cat locks/test.txt; } > locks/test.txt.new && mv locks/test.txt.new locks/test.txt
echo "wrote locks/test.txt"
bash tests/vllm/setup.sh --lock "${args[@]}"
"$uv" pip compile -q --universal --python-version 3.11 --no-header --annotation-style line \
  "${args[@]}" -o locks/mcp1.txt locks/mcp1.in
{ echo "# An MCP server's environment on the 1.x SDK (tests/integration/test_mcp_tools.py), from"
  echo "# locks/mcp1.in, every platform, Python >= 3.11. Written by scripts/lock.sh; do not edit."
  cat locks/mcp1.txt; } > locks/mcp1.txt.new && mv locks/mcp1.txt.new locks/mcp1.txt
echo "wrote locks/mcp1.txt"

tools=$(sed -n 's/^grpcio-tools==\([^ ;]*\).*/\1/p' locks/test.txt)
for proto in rljob/transferqueue/proto/transferqueue.proto rljob/weights/proto/weights.proto; do
  "$uv" run -q --no-project --isolated --with "grpcio-tools==$tools" -- python -m grpc_tools.protoc \
    -I runtime --python_out=runtime --pyi_out=runtime --grpc_python_out=runtime "$proto"
done
echo "regenerated the gRPC code with grpcio-tools $tools"
# what the code needs (tests/unit/test_lock.py holds pyproject.toml's lower bounds to it)
grep -h "^GRPC_GENERATED_VERSION\|^# Protobuf Python Version" runtime/rljob/*/proto/*.py | sort -u

if ((test)); then
  bash .ci/test
fi
