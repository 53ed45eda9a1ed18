"""The accelerators' datasheets (pure data): memory, HBM bandwidth, peak FLOP/s, and
what the cost model assumes a step sustains of them. The planner's cost model and a
rollout device's memory budget read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """One accelerator: HBM bandwidth (bytes/s), peak dense FLOP/s, memory (bytes)."""

    name: str
    mem_bandwidth: float
    peak_flops: float
    memory: float
    # fixed per decode step: kernel launches, sampling, scheduling
    step_overhead: float = 0.004
    # fraction of peak a training step sustains (MFU)
    train_efficiency: float = 0.35
    # all-reduce/all-gather cost grows with the device count: T(n) = T1/n · (1 + a·log2 n)
    comm_alpha: float = 0.05
    # share of peak bandwidth / FLOP/s a decode step reaches in practice
    decode_bw_efficiency: float = 0.6
    decode_flops_efficiency: float = 0.5


HARDWARE = {
    # Ascend 910B: 64 GB HBM2e, ~1.6 TB/s, ~313 TFLOP/s bf16
    "ascend": Hardware("Ascend 910B", 1.6e12, 313e12, 64e9),
    # an 80 GB Hopper-class GPU
    "gpu": Hardware("H100 80GB", 3.35e12, 989e12, 80e9, step_overhead=0.003),
    # a laptop-class CPU socket
    "cpu": Hardware("CPU", 40e9, 1.0e12, 16e9, step_overhead=0.002, train_efficiency=0.2),
}
