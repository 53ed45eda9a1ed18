"""RLJob: disaggregated, asynchronous, streaming RL post-training of LLMs.

The `rljob` package holds everything that runs the job (importable without
kopf); the Kubernetes control plane lives in `rljob_operator`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rljob")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0"
