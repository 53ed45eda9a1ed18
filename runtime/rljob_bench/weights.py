"""`rljob bench weights`: one weight version moved from a trainer's sender to a
rollout replica in another process, over each transport side by side: `grpc`
(host bytes streamed in 4 MiB chunks) and `collective` (buckets broadcast in a
process group of the two: gloo on CPU, as a CPU job does; NCCL/HCCL on devices).

The state has the tensor shapes of a Qwen2 model built from a config (`--model`:
the quickstart's, Qwen2.5-0.5B's (default, bfloat16: 0.99 GB) or Qwen2.5-7B's),
random values; with `--lora R` a LoRA job's update too: the rank-R adapter on every
linear module of the layers, alone (`weights/adapter.py`). Printed per transport: the
sender's publish seconds (host copy or bucket copy), the receiver's transfer
seconds (first byte to last) and the whole update (published to loaded in the
replica, which was waiting for it), medians over the rounds after a first one
(the replica's start-up and joining)."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import statistics
import time

import torch

QWEN2_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936}
# the shapes `--model` names (config.json's fields): Qwen2.5-0.5B's are Qwen2-0.5B's
MODELS = {
    "quickstart": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100},
    "qwen2.5-0.5b": QWEN2_05B,
    "qwen2.5-7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False},
}
TRANSPORTS = ("grpc", "collective")
LINEAR = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def qwen2_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Hugging Face names and shapes of a Qwen2 model's weights (pure; tied head)."""
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
                   p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
                   p + "self_attn.o_proj.weight": (h, h),
                   p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                   p + "mlp.down_proj.weight": (h, f),
                   p + "input_layernorm.weight": (h,),
                   p + "post_attention_layernorm.weight": (h,)}
    shapes["model.norm.weight"] = (h,)
    if not cfg.get("tie_word_embeddings", True):
        shapes["lm_head.weight"] = (v, h)
    return shapes


def lora_shapes(cfg: dict, rank: int) -> dict[str, tuple[int, ...]]:
    """A rank-`rank` LoRA adapter on every linear module of a Qwen2 model's layers (the
    default of model.lora): PEFT's saved names and shapes, A (r, in) and B (out, r)
    (pure)."""
    base = qwen2_shapes({**cfg, "num_hidden_layers": 1, "tie_word_embeddings": True})
    shapes = {}
    for i in range(cfg["num_hidden_layers"]):
        for module in LINEAR:
            out, inp = base[f"model.layers.0.{module}.weight"]
            stem = f"base_model.model.model.layers.{i}.{module}"
            shapes |= {f"{stem}.lora_A.weight": (rank, inp), f"{stem}.lora_B.weight": (out, rank)}
    return shapes


def nbytes(shapes: dict[str, tuple[int, ...]], dtype: str) -> int:
    """The bytes of tensors of `shapes` in `dtype` (pure: exact without making them)."""
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return sum(size * math.prod(s) for s in shapes.values())


def _random(shapes: dict[str, tuple[int, ...]], dtype: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(s, generator=g).to(getattr(torch, dtype)) for n, s in shapes.items()}


def _host_bytes() -> int:
    """Host memory available (the kernel's MemAvailable: free and reclaimable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


class _Sink:
    """A rollout engine that keeps what it is given (the replica's side of the bench)."""

    version, epoch, drain_seconds, transfer_seconds, weight_ranks = -1, 0, 0.0, 0.0, 0

    def load_weights(self, state, version, epoch=0):
        self.state, self.version, self.epoch = state, version, epoch

    def weight_device(self):
        return torch.device("cpu")


def _replica(address: str, transport: str, rounds: int, out) -> None:
    from rljob.weights import WeightReceiver

    torch.set_num_threads(1)
    receiver = WeightReceiver(address, "bench-0", transport=transport, backend="gloo")
    engine = _Sink()
    for version in range(rounds):
        receiver.load_latest(engine, version, wait=600)
        out.put((version, receiver.transfer_seconds[-1], time.monotonic(),
                 sum(t.numel() * t.element_size() for t in engine.state.values())))
    receiver.stop()


def run_transport(transport: str, state: dict[str, torch.Tensor], rounds: int) -> dict:
    from rljob.infra.netutil import free_port
    from rljob.weights import WeightSender

    sender = WeightSender(f"127.0.0.1:{free_port()}", transport=transport)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_replica, args=(f"127.0.0.1:{sender.port}", transport,
                                              rounds + 1, out), daemon=True)
    proc.start()
    publish, transfer, update, nbytes = [], [], [], 0
    try:
        for version in range(rounds + 1):
            t0 = time.monotonic()
            sender.publish(version, state)
            published = time.monotonic()  # one clock for both processes (CLOCK_MONOTONIC)
            publish.append(published - t0)
            got, t, loaded, nbytes = out.get(timeout=900)
            assert got == version
            if version:  # the first: start-up and joining
                transfer.append(t)
                update.append(loaded - published)
    finally:
        proc.join(60)
        sender.stop(grace=0)
    return {"publish_seconds": statistics.median(publish),
            "transfer_seconds": statistics.median(transfer),
            "update_seconds": statistics.median(update), "bytes": nbytes,
            "transfer_gb_per_s": nbytes / statistics.median(transfer) / 1e9}


def run(rounds: int = 3, layers: int | None = None, dtype: str = "bfloat16",
        model: str = "qwen2.5-0.5b", lora: int | None = None) -> dict:
    """Whole versions over both transports, and with `lora` the adapter of that rank
    alone over gRPC (a LoRA job's update). A model whose whole version would not fit
    three times in free host memory (the state, the sender's copy, the replica's) is
    not moved whole: its byte count is exact all the same."""
    cfg = dict(MODELS[model])
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    shapes = qwen2_shapes(cfg)
    full = nbytes(shapes, dtype)
    results = {"model": {"name": model, "layers": cfg["num_hidden_layers"], "dtype": dtype,
                         "tensors": len(shapes), "rounds": rounds, "gb": full / 1e9},
               "transports": {}}
    if 3 * full < _host_bytes():
        state = _random(shapes, dtype)
        results["transports"] = {t: run_transport(t, state, rounds) for t in TRANSPORTS}
        del state
        g, c = results["transports"]["grpc"], results["transports"]["collective"]
        results["collective_over_grpc"] = {k: c[k] / g[k] for k in
                                           ("publish_seconds", "transfer_seconds",
                                            "update_seconds")}
    else:
        results["model"]["not_moved"] = (f"{full / 1e9:.1f} GB three times is more than "
                                         f"the {_host_bytes() / 1e9:.1f} GB available")
    if lora:
        adapter = lora_shapes(cfg, lora)
        r = run_transport("grpc", _random(adapter, dtype), rounds)
        results["lora"] = {"rank": lora, "tensors": len(adapter), "grpc": r,
                           "bytes_over_full": r["bytes"] / full}
        if results["transports"]:
            results["lora"]["update_over_full"] = (
                r["update_seconds"] / results["transports"]["grpc"]["update_seconds"])
    return results


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m = results["model"]
    table = Table(title=f"one weight version: {m['name']} shapes, {m['layers']} layers, "
                  f"{m['dtype']}, {m['gb']:.2f} GB in {m['tensors']} tensors; "
                  f"medians of {m['rounds']} rounds")
    for col in ("update", "transport", "MB", "publish s", "transfer s", "update s", "GB/s"):
        table.add_column(col, justify="right")
    rows = [("whole", name, r) for name, r in results["transports"].items()]
    lora = results.get("lora")
    if lora:
        rows.append((f"LoRA r={lora['rank']}", "grpc", lora["grpc"]))
    for what, name, r in rows:
        table.add_row(what, name, f"{r['bytes'] / 1e6:.1f}", f"{r['publish_seconds']:.3f}",
                      f"{r['transfer_seconds']:.3f}", f"{r['update_seconds']:.3f}",
                      f"{r['transfer_gb_per_s']:.2f}")
    console = Console()
    console.print(table)
    if "not_moved" in m:
        console.print(f"whole versions not moved ({m['not_moved']}): "
                      f"{m['gb'] * 1e3:.1f} MB each")
    r = results.get("collective_over_grpc")
    if r:
        console.print(f"collective / grpc: publish {r['publish_seconds']:.2f}x, transfer "
                      f"{r['transfer_seconds']:.2f}x, update {r['update_seconds']:.2f}x")
    if lora:
        line = f"LoRA / whole (grpc): bytes {lora['bytes_over_full']:.4f}x"
        if "update_over_full" in lora:
            line += f", update {lora['update_over_full']:.3f}x"
        console.print(line)
