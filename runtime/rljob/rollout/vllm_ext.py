"""Runs inside vLLM's worker processes: mixed into the worker class through
`worker_extension_cls` (so it imports nothing heavier than torch at load time).

`rljob_reload` takes a weight version as safetensors bytes (tensors inside
`collective_rpc` arguments would arrive as plain lists) and reloads it in place
through the model runner's `reload_weights`, which keeps every backend's own
weight layout (the CPU backend repacks linear weights after a load, so loading
into the model's parameters directly does not work there). Every worker of the
replica runs it; each keeps the shard its tensor-parallel rank needs."""

from __future__ import annotations


class WeightUpdateExtension:
    def rljob_reload(self, data: bytes) -> int:
        """Load a Hugging Face-named state dict (safetensors bytes); return its tensor count."""
        from safetensors.torch import load

        state = load(data)
        self.model_runner.reload_weights(weights_iterator=list(state.items()))
        return len(state)
