"""The Megatron-core adapter: the trainer engine `trainer.engine: megatron`, for NPU (torch_npu +
MindSpeed) and GPU, written against mcore's public API and imported lazily
(`pip install 'rljob[npu]'`).

- `MegatronEngine.build()`: tensor/pipeline parallel groups
  (`parallel_state.initialize_model_parallel`), a `GPTModel` whose
  `TransformerConfig` mirrors the Hugging Face config (GQA, SwiGLU, RMSNorm,
  QKV bias for Qwen2), weights converted from the Hugging Face checkpoint.
- `mcore_token_logprobs(...)`: the same quantity the torch engine computes, so the
  GRPO code in `algorithms.py` runs unchanged on top of it.
- `hf_to_mcore` / `mcore_to_hf`: the weight layouts (fused QKV interleaved per
  query group, fused gate/up projection), also used to publish trainer weights
  to vLLM rollouts, which load Hugging Face names.
- `shard_tp` / `unshard_tp`: a full mcore state ↔ one tensor-parallel rank's
  shards (vocab-parallel embedding and output layer, column-parallel QKV by
  query groups and gate/up halves, row-parallel projections).
- `MegatronPolicy`: the trainer worker's `trainer.engine: megatron` (see
  `policy.py`): policy and frozen reference GPTModels, log-probs through the
  vocab-parallel cross entropy, DDP over the data-parallel group, weights
  gathered over the tensor-parallel group and published under Hugging Face names.
  Pipeline parallelism (pp > 1) is not wired into the worker; the API refuses it.
"""

from __future__ import annotations

import re

import torch

from ..sampling import PLAIN, TokenDistribution, sampled_logprobs
from .policy import Policy, matmul_weights_to, register_trainer_engine


def _layout(cfg: dict) -> tuple[int, int, int, int]:
    heads = cfg["num_attention_heads"]
    groups = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // heads)
    return heads, groups, head_dim, heads // groups


# per-layer tensors that keep their layout and only change name (HF, mcore)
_SAME_PER_LAYER = (("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
                   ("input_layernorm.weight", "input_layernorm.weight"),
                   ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
                   ("mlp.down_proj.weight", "mlp.linear_fc2.weight"))


# per-layer tensors only some architectures have (Qwen3's q/k RMS norms)
_OPTIONAL_PER_LAYER = (("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
                       ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"))

MCORE_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}  # what mcore's RoPE fixes


def _rope_theta(cfg: dict) -> float:
    return cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000)


def qkv_bias(cfg: dict) -> bool:
    """Qwen2 has QKV biases always (no config key); others say so in attention_bias."""
    return bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2"))


def qk_norm(cfg: dict) -> bool:
    return cfg.get("model_type") in ("qwen3", "qwen3_moe")


def rope_scaling(cfg: dict) -> float | None:
    """The llama3 RoPE scaling factor (None: no scaling). mcore's RoPE takes the
    factor only and fixes the rest at Llama-3.1's values: another rope type or
    other values cannot be expressed, and are refused (`architecture_problem`)."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not rs or rs.get("rope_type", rs.get("type")) in (None, "default"):
        return None
    return float(rs["factor"])


def architecture_problem(cfg: dict) -> str | None:
    """Why the Megatron engine cannot train this checkpoint exactly (None: it can)."""
    if cfg.get("model_type") not in ("qwen2", "llama", "qwen3", "mistral"):
        return (f"model_type {cfg.get('model_type')!r} is not one the megatron engine maps "
                "(qwen2, qwen3, llama, mistral); use trainer.engine torch")
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind not in (None, "default", "llama3"):
        return (f"rope_scaling type {kind!r}: the megatron engine has llama3 scaling only; "
                "use trainer.engine torch")
    if kind == "llama3":
        other = {k: rs.get(k) for k, v in MCORE_LLAMA3_ROPE.items() if rs.get(k, v) != v}
        if other:
            return (f"rope_scaling {other}: the megatron engine's llama3 scaling fixes "
                    f"{MCORE_LLAMA3_ROPE}; use trainer.engine torch")
    return None


def hf_to_mcore(state: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    """Hugging Face Llama/Qwen2 names → mcore GPTModel names (TP = 1 shards)."""
    heads, groups, hd, per = _layout(cfg)
    out = {"embedding.word_embeddings.weight": state["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": state["model.norm.weight"]}
    if "lm_head.weight" in state and not cfg.get("tie_word_embeddings"):
        out["output_layer.weight"] = state["lm_head.weight"]
    for i in range(cfg["num_hidden_layers"]):
        hf, mc = f"model.layers.{i}.", f"decoder.layers.{i}."
        for kind in ("weight", "bias"):
            q = state.get(f"{hf}self_attn.q_proj.{kind}")
            if q is None:
                continue
            k, v = state[f"{hf}self_attn.k_proj.{kind}"], state[f"{hf}self_attn.v_proj.{kind}"]
            parts = []
            for g in range(groups):  # mcore: per query group, its q heads then k then v
                parts += [q[g * per * hd:(g + 1) * per * hd], k[g * hd:(g + 1) * hd],
                          v[g * hd:(g + 1) * hd]]
            out[f"{mc}self_attention.linear_qkv.{kind}"] = torch.cat(parts)
        for hf_name, mc_name in _SAME_PER_LAYER:
            out[mc + mc_name] = state[hf + hf_name]
        for hf_name, mc_name in _OPTIONAL_PER_LAYER:
            if hf + hf_name in state:
                out[mc + mc_name] = state[hf + hf_name]
        out[f"{mc}mlp.linear_fc1.weight"] = torch.cat([state[f"{hf}mlp.gate_proj.weight"],
                                                       state[f"{hf}mlp.up_proj.weight"]])
    return out


_PER_LAYER_TO_HF = {mc: hf for hf, mc in _SAME_PER_LAYER + _OPTIONAL_PER_LAYER}
_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")


def mcore_tensor_to_hf(name: str, t: torch.Tensor, cfg: dict, tied: bool
                       ) -> list[tuple[str, torch.Tensor]]:
    """One whole mcore tensor under Hugging Face names (pure; views, no copy): a fused
    qkv gives q, k and v, a fused gate/up gives both; `tied`: the embedding is the
    head too. A tensor Hugging Face has no name for gives none."""
    if name == "embedding.word_embeddings.weight":
        return [("model.embed_tokens.weight", t)] + ([("lm_head.weight", t)] if tied else [])
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", t)]
    if name == "output_layer.weight":
        return [("lm_head.weight", t)]
    m = _LAYER.fullmatch(name)
    if m is None:
        return []
    hf, suffix = f"model.layers.{m[1]}.", m[2]
    if suffix.startswith("self_attention.linear_qkv.") and suffix.endswith(("weight", "bias")):
        kind = suffix.rsplit(".", 1)[1]
        _, groups, hd, per = _layout(cfg)
        block = (per + 2) * hd
        qs, ks, vs = [], [], []
        for g in range(groups):
            b = t[g * block:(g + 1) * block]
            qs.append(b[:per * hd])
            ks.append(b[per * hd:(per + 1) * hd])
            vs.append(b[(per + 1) * hd:])
        return [(f"{hf}self_attn.q_proj.{kind}", torch.cat(qs)),
                (f"{hf}self_attn.k_proj.{kind}", torch.cat(ks)),
                (f"{hf}self_attn.v_proj.{kind}", torch.cat(vs))]
    if suffix == "mlp.linear_fc1.weight":
        gate, up = t.chunk(2)
        return [(f"{hf}mlp.gate_proj.weight", gate), (f"{hf}mlp.up_proj.weight", up)]
    if suffix in _PER_LAYER_TO_HF:
        return [(hf + _PER_LAYER_TO_HF[suffix], t)]
    return []


def ties_head(state, cfg: dict) -> bool:
    """Whether the embedding is also the head (no output layer of its own)."""
    return bool(cfg.get("tie_word_embeddings")) and "output_layer.weight" not in state


def mcore_to_hf(state: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    """The inverse of `hf_to_mcore`."""
    tied = ties_head(state, cfg)
    return {hf_name: v for name, t in state.items()
            for hf_name, v in mcore_tensor_to_hf(name, t, cfg, tied)}


# mcore parameter suffix → how tensor parallelism splits it (dimension, kind)
_COLUMN = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
_VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")


def _tp_kind(name: str) -> str:
    if name in _VOCAB:
        return "vocab"
    if name.endswith(_COLUMN):
        return "column"
    if name.endswith("mlp.linear_fc1.weight"):
        return "glu"
    if name.endswith(_ROW):
        return "row"
    return "replicated"  # norms


def shard_tp(state: dict[str, torch.Tensor], tp: int, rank: int) -> dict[str, torch.Tensor]:
    """One tensor-parallel rank's part of a full mcore state (pure)."""
    out = {}
    for name, t in state.items():
        kind = _tp_kind(name)
        if tp == 1 or kind == "replicated":
            out[name] = t
            continue
        dim = 1 if kind == "row" else 0
        if t.shape[dim] % (2 * tp if kind == "glu" else tp):
            raise ValueError(f"{name}: size {t.shape[dim]} does not split over "
                             f"trainer.parallelism.tp={tp}; choose a tp that divides it")
        if kind == "glu":  # [gate; up] → [gate part; up part] per rank
            gate, up = t.chunk(2)
            out[name] = torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
        else:  # QKV is laid out per query group, so a contiguous part is whole groups
            out[name] = t.chunk(tp, dim=dim)[rank].contiguous()
    return out


def unshard_tp(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The inverse of `shard_tp`: the full state from every rank's part, in rank order."""
    tp = len(shards)
    out = {}
    for name, t in shards[0].items():
        kind = _tp_kind(name)
        parts = [s[name] for s in shards]
        if tp == 1 or kind == "replicated":
            out[name] = t
        elif kind == "glu":
            halves = [p.chunk(2) for p in parts]
            out[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        else:
            out[name] = torch.cat(parts, dim=1 if kind == "row" else 0)
    return out


class MegatronEngine:
    """One trainer rank's model under Megatron-core parallelism."""

    def __init__(self, hf_config: dict, tensor_parallel: int = 1, pipeline_parallel: int = 1,
                 dtype: torch.dtype = torch.float32, cpu_init: bool = False, seed: int = 0):
        try:
            import megatron.core  # noqa: F401
        except ImportError as exc:
            raise RuntimeError("trainer.engine megatron needs megatron-core: "
                               "pip install 'rljob[npu]'") from exc
        self.cfg = hf_config
        self.tp, self.pp = tensor_parallel, pipeline_parallel
        self.dtype = dtype
        self.cpu_init = cpu_init
        self.seed = seed
        self.model = None

    def transformer_config(self):
        import torch.nn.functional as F
        from megatron.core.transformer.transformer_config import TransformerConfig

        c = self.cfg
        heads, groups, hd, _ = _layout(c)
        return TransformerConfig(
            num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"],
            num_attention_heads=heads, num_query_groups=groups, kv_channels=hd,
            ffn_hidden_size=c["intermediate_size"], normalization="RMSNorm",
            layernorm_epsilon=c.get("rms_norm_eps", 1e-6), gated_linear_unit=True,
            activation_func=F.silu, add_bias_linear=False,
            add_qkv_bias=qkv_bias(c), qk_layernorm=qk_norm(c),
            # mcore's defaults are 0.1 for both; the Hugging Face model (and so the
            # rollout's log-probs) has no hidden dropout and the config's attention one
            hidden_dropout=0.0, attention_dropout=float(c.get("attention_dropout", 0.0)),
            tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp,
            params_dtype=self.dtype, bf16=self.dtype == torch.bfloat16,
            use_cpu_initialization=self.cpu_init)

    def build(self):
        from megatron.core import parallel_state
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(self.tp, self.pp)
        if not self.cpu_init:
            # mcore initialises tensor-parallel weights (and runs dropout) under its
            # model-parallel RNG tracker, which must be seeded first; the same seed
            # on every tp rank, offset by mcore per rank where it must differ
            from megatron.core import tensor_parallel

            tensor_parallel.model_parallel_cuda_manual_seed(self.seed)
        c = self.cfg
        self.model = GPTModel(
            config=self.transformer_config(),
            transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm",
                                                            qk_layernorm=qk_norm(c)),
            vocab_size=c["vocab_size"], max_sequence_length=c["max_position_embeddings"],
            position_embedding_type="rope", rotary_base=int(_rope_theta(c)),
            rope_scaling=rope_scaling(c) is not None,
            rope_scaling_factor=rope_scaling(c) or 8.0,
            share_embeddings_and_output_weights=bool(c.get("tie_word_embeddings")),
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage())
        return self.model

    def load_hf_state(self, state: dict[str, torch.Tensor]) -> None:
        load_mcore_state(self.model, hf_to_mcore(state, self.cfg))

    def hf_state(self) -> dict[str, torch.Tensor]:
        state = {k: v for k, v in self.model.state_dict().items() if "_extra_state" not in k}
        return mcore_to_hf(state, self.cfg)


def _load_mindspeed(device) -> None:
    """On Ascend, MindSpeed patches mcore for torch_npu (fused kernels, hccl); it
    must be imported before mcore builds a model. Its adaptor parses the process's
    command line when imported (26.1.0_core_r0.12.1: `args_utils.get_mindspeed_args`,
    `parse_known_args` over sys.argv: `-h` would exit the process and a flag named
    like one of its features would switch it on), so it sees the program name only.
    It imports `megatron.training` (`mindspeed/te/pytorch/fp8/tensor/float8_tensor.py`),
    which PyPI's megatron-core does not ship: the runtime image puts Megatron-LM's
    source of the same release on PYTHONPATH (images/runtime/Dockerfile)."""
    if device.kind != "ascend":
        return
    import sys

    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        import mindspeed.megatron_adaptor  # noqa: F401 - patches megatron.core on import
    except ImportError as exc:
        raise RuntimeError(f"trainer.engine megatron on accelerator.type ascend needs "
                           f"MindSpeed and Megatron-LM's megatron.training ({exc}): use "
                           f"the runtime image (images/runtime/Dockerfile)") from exc
    finally:
        sys.argv = argv


def load_mcore_state(model, state: dict[str, torch.Tensor]) -> None:
    """Load mcore-named weights (a whole model or one tp rank's shard); every
    parameter must be given (mcore's `_extra_state` buffers excepted)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the mcore model: missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}")


def mcore_token_logprobs(model, input_ids: torch.Tensor,
                         dist: TokenDistribution = PLAIN) -> torch.Tensor:
    """log π(next token) per position of right-padded sequences under the sampling
    distribution `dist`, as the torch engine's `token_logprobs`: causal attention
    alone keeps every real token off the pads. Without top-p the vocab-parallel
    cross entropy of the tempered logits sums over the tp shards; a top-p nucleus
    needs the whole vocabulary, so its logits are gathered from the shards first."""
    length = input_ids.shape[1]
    position_ids = torch.arange(length, device=input_ids.device).unsqueeze(0)
    causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).triu(1)
    logits = model(input_ids, position_ids.expand_as(input_ids), causal[None, None])
    return vocab_parallel_logprobs(logits[:, :-1], input_ids[:, 1:].contiguous(), dist)


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                            dist: TokenDistribution = PLAIN) -> torch.Tensor:
    """log p(target) under `dist` from this tp rank's vocabulary shard of the logits
    [..., V / tp] (rljob.sampling's definition, whatever the shards)."""
    from megatron.core import tensor_parallel

    logits = logits.float()
    if dist.truncated:
        whole = tensor_parallel.gather_from_tensor_model_parallel_region(logits)
        return sampled_logprobs(whole, targets, dist)
    if dist.vocab:  # this shard's columns past the tokenizer are not tokens
        from megatron.core import parallel_state

        width = logits.shape[-1]
        first = parallel_state.get_tensor_model_parallel_rank() * width
        ids = torch.arange(first, first + width, device=logits.device)
        logits = logits.masked_fill(ids >= dist.vocab, float("-inf"))
    return -tensor_parallel.vocab_parallel_cross_entropy(
        (logits / dist.temperature).contiguous(), targets)


@register_trainer_engine("megatron")
class MegatronPolicy(Policy):
    """trainer.engine megatron in the trainer worker."""

    def __init__(self, spec, tok, device, torch_device, rank: int, world: int):
        import torch.distributed as dist
        from megatron.core import parallel_state

        from ..inputs.models import build_model

        par = spec.trainer.parallelism
        if par.pp != 1:
            raise SystemExit("trainer.parallelism.pp > 1: the trainer worker does not run "
                             "mcore's pipeline schedule; use pp: 1 (tp and data parallelism "
                             "are supported)")
        if world % par.tp:
            raise SystemExit(f"trainer.parallelism.tp={par.tp} does not divide the "
                             f"{world} trainer ranks")
        from .policy import compute_dtype

        self.device = torch_device
        self.tp = par.tp
        self.compute = compute_dtype(spec, device)
        _load_mindspeed(device)
        # the starting weights as Hugging Face builds them (pretrained or random
        # init), float32: the master copy; the passes compute in `self.compute`
        hf = build_model(spec.model, tok, seed=spec.algorithm.seed, dtype=torch.float32)
        self.cfg = hf.config.to_dict()
        self.hf_config = hf.config
        full = hf_to_mcore(hf.state_dict(), self.cfg)
        del hf
        self.engine = MegatronEngine(self.cfg, par.tp, par.pp, dtype=torch.float32,
                                     cpu_init=not device.accelerated, seed=spec.algorithm.seed)
        self.model = self.engine.build().to(torch_device)
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        load_mcore_state(self.model, shard_tp(full, self.tp, self.tp_rank))
        self.data_rank = parallel_state.get_data_parallel_rank()
        self.data_world = parallel_state.get_data_parallel_world_size()
        self.data_group = parallel_state.get_data_parallel_group()
        self.wrapped = self.model
        if self.data_world > 1:
            ids = [torch_device] if device.accelerated else None
            self.wrapped = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=ids,
                process_group=parallel_state.get_data_parallel_group())
        self.ref = None
        self._dist = dist

    def freeze_reference(self, state: dict | None = None) -> None:
        ref = MegatronEngine(self.cfg, self.tp, 1, dtype=self.engine.dtype,
                             cpu_init=self.engine.cpu_init, seed=self.engine.seed).build()
        ref = ref.to(self.device)
        ref.load_state_dict(state if state is not None else self.model.state_dict())
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        matmul_weights_to(ref, self.compute, (ColumnParallelLinear, RowParallelLinear))
        self.ref = ref

    def _logprobs(self, model, batch, dist) -> torch.Tensor:
        return mcore_token_logprobs(model, batch.input_ids, dist)

    def hf_tensors(self):
        """Collective over the first data-parallel replica's tensor-parallel group:
        rank 0 (the weight sender) gets each weight whole, under Hugging Face names in
        the compute dtype on its device, one parameter at a time (it holds one
        gathered parameter beyond its own shards); every other rank yields nothing.
        Only the shards are sent, only to rank 0 (no all-gather)."""
        if self.data_rank != 0:
            return
        state = {k: v for k, v in self.model.state_dict().items() if "_extra_state" not in k}
        tied = ties_head(state, self.cfg)
        first = self._dist.get_global_rank(self.tp_group, 0) if self.tp > 1 else 0
        for name, t in state.items():
            t = t.detach().to(self.compute)
            if self.tp > 1:
                parts = ([torch.empty_like(t) for _ in range(self.tp)]
                         if self.tp_rank == 0 else None)
                self._dist.gather(t.contiguous(), parts, dst=first, group=self.tp_group)
                if self.tp_rank != 0:
                    continue
                t = unshard_tp([{name: p} for p in parts])[name]
            yield from mcore_tensor_to_hf(name, t, self.cfg, tied)

    def _grad_sumsq(self) -> torch.Tensor:
        """Tensor-parallel shards count once each, replicated weights (norms) once
        over the group: summed over the tensor-parallel group."""
        total = torch.zeros((), device=self.device)
        for p in self.model.parameters():
            if p.grad is None:
                continue
            sq = (p.grad.float() ** 2).sum()
            total += sq if getattr(p, "tensor_model_parallel", False) else sq / self.tp
        if self.tp > 1:
            self._dist.all_reduce(total, group=self.tp_group)
        return total

    def saves_checkpoint(self, rank: int) -> bool:
        return self.data_rank == 0  # one copy of each tensor-parallel shard

    def checkpoint_name(self) -> str:
        return f"trainer-tp{self.tp_rank}.pt"

    def save_pretrained(self, path, tok) -> None:
        """Collective: rank 0 writes a Hugging Face checkpoint of the gathered weights."""
        from transformers import AutoModelForCausalLM

        state = self.hf_state()
        if state is not None:
            model = AutoModelForCausalLM.from_config(self.hf_config)
            model.load_state_dict(state, strict=False)
            model.save_pretrained(path)
            tok.save_pretrained(path)
