"""Storage units: where cells live. One small interface, one module per backend.

A backend is a StorageUnit class that joins the registry by decorator
(`@register_backend("redis")`, constructed with its address and options);
clients open units by the (backend, address) pairs the controller hands out.
"""

from .base import BACKENDS, StorageUnit, cell_key, connect, register_backend
from . import memory, redis_unit  # noqa: F401  (register the built-in backends)

__all__ = ["BACKENDS", "StorageUnit", "cell_key", "connect", "register_backend"]
