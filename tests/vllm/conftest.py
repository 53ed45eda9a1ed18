"""The vLLM tier runs in the environment tests/vllm/setup.sh builds (the real
vLLM CPU build, `.ci/test` runs it there); in other environments its tests skip,
and where `.ci/test` runs them a vLLM that does not import fails the run
(tests/tiers.py)."""

import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the tiny model needs little
# the engines' CPU workers are placed by the OS, one thread each (what vLLM's automatic
# binding gives them): that binding puts every engine on the machine's first core, so
# the tier's parts, which the test command runs at once, would share one core
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")
