"""TransferQueue: a column-oriented streaming sample store with per-task controllers.

Data plane: storage units (Redis, or in-process memory). Control plane: a gRPC
controller that tracks, per task, which rows are ready, leased and acked.
"""

from .client import AsyncTransferQueueClient, Batch, Task, TransferQueueClient, TransferQueueError
from .schema import ColumnSpec, json_column, scalar, tensor

__all__ = [
    "AsyncTransferQueueClient",
    "Batch",
    "ColumnSpec",
    "Task",
    "TransferQueueClient",
    "TransferQueueError",
    "json_column",
    "scalar",
    "tensor",
]
