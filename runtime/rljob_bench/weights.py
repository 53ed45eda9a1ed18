"""`rljob bench weights`: one weight version moved from a trainer's sender to a
rollout replica in another process, over each transport side by side: `grpc`
(host bytes streamed in 4 MiB chunks) and `collective` (buckets broadcast in a
process group of the two: gloo on CPU, as a CPU job does; NCCL/HCCL on devices).

The state has the tensor shapes of a Qwen2 model built from a config (default:
Qwen2-0.5B's, bfloat16: 0.99 GB), random values. Printed per transport: the
sender's publish seconds (host copy or bucket copy), the receiver's transfer
seconds (first byte to last) and the whole update (published to loaded in the
replica, which was waiting for it), medians over the rounds after a first one
(the replica's start-up and joining)."""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time

import torch

QWEN2_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936}
TRANSPORTS = ("grpc", "collective")


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
    return shapes


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


def run(rounds: int = 3, layers: int | None = None, dtype: str = "bfloat16") -> dict:
    cfg = dict(QWEN2_05B)
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    g = torch.Generator().manual_seed(0)
    state = {n: torch.randn(s, generator=g).to(getattr(torch, dtype))
             for n, s in qwen2_shapes(cfg).items()}
    results = {"model": {"layers": cfg["num_hidden_layers"], "dtype": dtype,
                         "tensors": len(state), "rounds": rounds,
                         "gb": sum(t.numel() * t.element_size() for t in state.values()) / 1e9},
               "transports": {t: run_transport(t, state, rounds) for t in TRANSPORTS}}
    g, c = results["transports"]["grpc"], results["transports"]["collective"]
    results["collective_over_grpc"] = {k: c[k] / g[k] for k in
                                       ("publish_seconds", "transfer_seconds", "update_seconds")}
    return results


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m = results["model"]
    table = Table(title=f"one weight version: Qwen2-0.5B shapes, {m['layers']} layers, "
                  f"{m['dtype']}, {m['gb']:.2f} GB in {m['tensors']} tensors; "
                  f"medians of {m['rounds']} rounds")
    for col in ("transport", "publish s", "transfer s", "update s", "GB/s"):
        table.add_column(col, justify="right")
    for name, r in results["transports"].items():
        table.add_row(name, f"{r['publish_seconds']:.3f}", f"{r['transfer_seconds']:.3f}",
                      f"{r['update_seconds']:.3f}", f"{r['transfer_gb_per_s']:.2f}")
    console = Console()
    console.print(table)
    r = results["collective_over_grpc"]
    console.print(f"collective / grpc: publish {r['publish_seconds']:.2f}x, transfer "
                  f"{r['transfer_seconds']:.2f}x, update {r['update_seconds']:.2f}x")
