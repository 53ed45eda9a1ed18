"""Runs inside vLLM's worker processes: mixed into the worker class through
`worker_extension_cls` (so it imports nothing heavier than torch at load time).

`rljob_reload` takes a weight version as a safetensors file the rollout wrote
(tensors inside `collective_rpc` arguments would arrive as plain lists, and bytes
would be copied to every worker whole) and reloads it in place through the model
runner's `reload_weights`, which keeps every backend's own weight layout (the CPU
backend repacks linear weights after a load, so loading into the model's
parameters directly does not work there). Every worker of the replica runs it,
reading one tensor at a time; each keeps the shard its tensor-parallel rank needs.

`rljob_join` / `rljob_receive` are the collective path: each worker joins the
replica's weight group as rank first_rank + its rank, and receives a version's
buckets from the trainer into its own device, feeding each bucket's tensors to
the same reload before the next bucket comes.

`rljob_logprobs_mode` gives the worker's sampler the engine's `logprobs_mode`
where the platform's model runner built its own sampler without it.

`rljob_output_counts` says how many tokens each request has sampled: an update that
keeps the requests (workflow.interruptCache keep) reads it with the scheduler paused,
and the tokens from that count on are the new weights'."""

from __future__ import annotations


class WeightUpdateExtension:
    def rljob_reload(self, path: str) -> int:
        """Load a Hugging Face-named version from the safetensors file at `path`, one
        tensor at a time (each worker keeps its shard of each: the file's pages are
        shared by the replica's workers); return its tensor count."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            names = list(f.keys())
            self.model_runner.reload_weights(
                weights_iterator=((name, f.get_tensor(name)) for name in names))
        return len(names)

    def rljob_join(self, backend: str, store: str, prefix: str, first_rank: int,
                   world: int) -> int:
        """Join the replica's weight group (blocks until every rank has); return the rank."""
        from rljob.weights.collective import new_group

        rank = first_rank + self.rank
        self._rljob_group, self._rljob_store = new_group(backend, store, prefix, rank, world)
        self._rljob_backend = backend
        return rank

    def rljob_receive(self, sizes: list[int], slots: list) -> tuple[float, int]:
        """Receive one broadcast version and reload it as it comes, bucket by bucket
        (`receive_stream`: the worker holds one bucket beyond its shard); return
        (seconds receiving, tensors)."""
        from rljob.weights.collective import Slot, device_of, receive_stream

        seconds = [0.0]
        stream = receive_stream(self._rljob_group, sizes, [Slot(*s) for s in slots],
                                device_of(self._rljob_backend), seconds)
        self.model_runner.reload_weights(weights_iterator=stream)
        for _ in stream:  # a loader that stopped early: the group's broadcasts go on
            pass
        return seconds[0], len(slots)

    def rljob_output_counts(self) -> dict[str, int]:
        """Each request's sampled tokens so far, by vLLM's internal request id (the
        model runner's own record; with the scheduler paused, every token the engine
        has sampled, whether or not its output has reached the client yet)."""
        return {rid: len(state.output_token_ids)
                for rid, state in self.model_runner.requests.items()}

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
