"""vLLM / vLLM-Ascend engine, against vLLM's public offline API (`vllm.LLM`).

Imported only when `rollout.engine: vllm`; needs `pip install rljob[npu]` (Ascend)
or vllm (GPU). New weights go in through the loaded model's `load_weights`,
which every vLLM model implements."""

from __future__ import annotations

from .engine import Generation, RolloutEngine, SamplingParams


class VLLMEngine(RolloutEngine):
    def __init__(self, model_spec, rollout_spec, tokenizer):
        try:
            import vllm
        except ImportError as exc:
            raise RuntimeError("rollout.engine vllm needs vllm (GPU) or vllm-ascend (Ascend NPU): "
                               "pip install 'rljob[npu]'") from exc
        self._vllm = vllm
        self.tok = tokenizer
        path = model_spec.path.removeprefix("random:")
        self.llm = vllm.LLM(model=path, tokenizer=model_spec.tokenizer_path
                            if not model_spec.tokenizer_path.startswith("builtin:") else path,
                            tensor_parallel_size=rollout_spec.tensor_parallel,
                            dtype=model_spec.dtype, enable_prefix_caching=True,
                            gpu_memory_utilization=0.85)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        # one request per prompt, each with its own seed: continuous batching runs them
        # all together, and a prompt's samples do not depend on the others
        sps = [self._vllm.SamplingParams(n=params.n, temperature=params.temperature,
                                         top_p=params.top_p, max_tokens=params.max_new_tokens,
                                         seed=seed, logprobs=0)
               for seed in params.prompt_seeds(len(prompts))]
        inputs = [{"prompt_token_ids": p} for p in prompts]
        outs = self.llm.generate(inputs, sps, use_tqdm=False)
        results = []
        for out in outs:
            group = []
            for c in out.outputs:
                lps = [next(iter(d.values())).logprob if d else 0.0 for d in (c.logprobs or [])]
                group.append(Generation(list(c.token_ids), lps))
            results.append(group)
        return results

    def load_weights(self, state_dict: dict, version: int) -> None:
        engine = self.llm.llm_engine
        runner = getattr(engine, "model_executor", None)
        if runner is not None and hasattr(runner, "driver_worker"):
            model = runner.driver_worker.model_runner.model
            model.load_weights(weights=list(state_dict.items()))
        else:  # newer vLLM: run in every worker
            self.llm.collective_rpc("load_weights", args=(list(state_dict.items()),))
        self.llm.reset_prefix_cache()
        self.version = version
