"""The vLLM tier runs in the environment tests/vllm/setup.sh builds (the real
vLLM CPU build, `.ci/test` runs it there); in other environments its tests skip,
and where `.ci/test` runs them a vLLM that does not import fails the run
(tests/tiers.py)."""

import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the tiny model needs little
