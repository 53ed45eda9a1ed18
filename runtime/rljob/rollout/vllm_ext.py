"""Runs inside vLLM's worker processes: mixed into the worker class through
`worker_extension_cls` (so it imports nothing heavier than torch at load time).

`rljob_reload` takes a weight version as safetensors bytes (tensors inside
`collective_rpc` arguments would arrive as plain lists) and reloads it in place
through the model runner's `reload_weights`, which keeps every backend's own
weight layout (the CPU backend repacks linear weights after a load, so loading
into the model's parameters directly does not work there). Every worker of the
replica runs it; each keeps the shard its tensor-parallel rank needs.

`rljob_join` / `rljob_receive` are the collective path: each worker joins the
replica's weight group as rank first_rank + its rank, and receives a version's
buckets from the trainer into its own device before the same reload.

`rljob_logprobs_mode` gives the worker's sampler the engine's `logprobs_mode`
where the platform's model runner built its own sampler without it."""

from __future__ import annotations


class WeightUpdateExtension:
    def rljob_reload(self, data: bytes) -> int:
        """Load a Hugging Face-named state dict (safetensors bytes); return its tensor count."""
        from safetensors.torch import load

        state = load(data)
        self.model_runner.reload_weights(weights_iterator=list(state.items()))
        return len(state)

    def rljob_join(self, backend: str, store: str, prefix: str, first_rank: int,
                   world: int) -> int:
        """Join the replica's weight group (blocks until every rank has); return the rank."""
        from rljob.weights.collective import new_group

        rank = first_rank + self.rank
        self._rljob_group, self._rljob_store = new_group(backend, store, prefix, rank, world)
        self._rljob_backend = backend
        return rank

    def rljob_receive(self, sizes: list[int], slots: list) -> tuple[float, int]:
        """Receive one broadcast version and reload it; return (seconds receiving, tensors)."""
        import time

        from rljob.weights.collective import Slot, device_of, receive, unpack

        t0 = time.monotonic()
        buckets = receive(self._rljob_group, sizes, device_of(self._rljob_backend))
        received = time.monotonic() - t0
        state = unpack([Slot(*s) for s in slots], buckets)
        self.model_runner.reload_weights(weights_iterator=list(state.items()))
        return received, len(state)

    def rljob_logprobs_mode(self, mode: str) -> str | None:
        """Make the worker's sampler report `mode` log-probs; return the mode it had
        when that differed (None when it already did). vllm-ascend 0.23.0's
        NPUModelRunner replaces vLLM's sampler with `AscendSampler()`, built without
        the engine's logprobs_mode (vllm_ascend/worker/model_runner_v1.py:333), so it
        keeps the default raw_logprobs (vllm_ascend/sample/sampler.py:73-76) although
        its top-k/top-p step computes processed log-probs when asked (sampler.py:
        164-180, read at sampling time): the log-probs would be of the model's raw
        softmax, not of the distribution the tokens were drawn from."""
        sampler = getattr(self.model_runner, "sampler", None)
        before = getattr(sampler, "logprobs_mode", mode)
        if before == mode:
            return None
        sampler.logprobs_mode = mode
        inner = getattr(sampler, "topk_topp_sampler", None)
        if inner is not None and hasattr(inner, "logprobs_mode"):
            inner.logprobs_mode = mode
        return before
