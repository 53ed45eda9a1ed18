"""Versioned weight sync: WeightSender (trainer rank 0) → WeightReceiver (rollouts).

The sender serves the latest published version over gRPC streaming, in
chunks, tensors as raw buffers (no pickling). Receivers fetch a version, and
report what they loaded, so the driver can release on-policy prompts only once
every live replica holds the new weights.

Every sender has an epoch (its life). A trainer restored from a checkpoint
publishes older versions than the ones replicas hold, under a new epoch:
receivers take the new epoch's weights at once, whatever their version, and a
replica that still holds another epoch's weights counts as holding none. In `weightSync: async` a receiver
fetches in the background into host memory and the engine swaps at a
generation-iteration boundary (delayed parameter update); in `sync` the
rollout blocks until the new weights are loaded.

Two data paths (`workflow.weightTransport`): `grpc` streams each version from host
memory in chunks (any network, across clusters); `collective` keeps the version
on the trainer's device in a few buckets and broadcasts them to each replica's
engine ranks in a process group of their own (`collective.py`: gloo, NCCL, HCCL),
gRPC staying the control plane.
"""

from .client import WeightClient
from .codec import CHUNK, new_epoch

# the replica's and the trainer's sides import torch: loaded when first named, so
# a process that only asks for versions (the driver) starts without it
_LAZY = {"WeightReceiver": "receiver", "WeightSender": "sender"}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CHUNK", "WeightClient", "WeightReceiver", "WeightSender", "new_epoch"]
