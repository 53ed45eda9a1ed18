"""TransferQueue: a column-oriented streaming sample store with per-task controllers.

Data plane: storage units (Redis, or in-process memory). Control plane: a gRPC
controller that tracks, per task, which rows are ready, leased and acked.

The names below are loaded on first use, so importing a submodule (the operator
reads `rljob.transferqueue.proto` and `.wire`) does not load the client, Redis or
the controller.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Batch": ".dataplane",
    "TransferQueueClient": ".client",
    "TransferQueueError": ".dataplane",
    "ColumnSpec": ".schema",
    "json_column": ".schema",
    "scalar": ".schema",
    "TaskSpec": ".schema",
    "tensor": ".schema",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
