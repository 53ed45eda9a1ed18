"""`rljob bench weight-memory`: what one weight update costs a tensor-parallel vLLM
replica's workers in memory, per transport. Runs in an environment with vLLM (the
vLLM tier's; on CPU the workers' memory is the host's).

Per transport (`grpc`, then `collective` over gloo), a vLLM engine with `--tp`
workers starts on a random Qwen2-shaped model (float32), a weight sender in this
process publishes a version, and the replica loads it. Each worker's resident memory is sampled
every few milliseconds while the update runs (allocations of 64 KiB or more
mapped on their own, `MALLOC_MMAP_THRESHOLD_`, so that freed memory leaves the
resident size); printed per transport: the peak growth over the level just before
the update, private (RssAnon: buffers the worker
allocated) and in all (VmRSS, with the pages of a shared file it maps), per worker
and for the rollout process itself, beside the model's size and the bucket size.

It imports only interfaces older versions of the project had too (engine,
sender, receiver), so `python -m rljob_bench.weight_memory` measures another
checkout when run with that checkout's runtime first on PYTHONPATH."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

TRANSPORTS = ("grpc", "collective")
SHAPE = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 12,
         "num_attention_heads": 16, "num_key_value_heads": 4}


class RssSampler:
    """Peak RssAnon / VmRSS growth of some processes while it runs (kB)."""

    def __init__(self, pids: dict[str, int], every: float = 0.002):
        self.pids, self.every = pids, every
        self.base = {name: _rss(pid) for name, pid in pids.items()}
        self.peak = dict(self.base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                anon, total = _rss(pid)
                a, t = self.peak[name]
                self.peak[name] = (max(a, anon), max(t, total))
            time.sleep(self.every)

    def stop(self) -> dict[str, tuple[float, float]]:
        """Per process: (peak RssAnon growth, peak VmRSS growth) in MB."""
        self._stop.set()
        self._thread.join()
        return {n: ((self.peak[n][0] - self.base[n][0]) / 1024,
                    (self.peak[n][1] - self.base[n][1]) / 1024) for n in self.pids}


def _rss(pid: int) -> tuple[int, int]:
    fields = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("RssAnon", "VmRSS"):
                fields[key] = int(value.split()[0])
    except OSError:
        return 0, 0
    return fields.get("RssAnon", 0), fields.get("VmRSS", 0)


def _descendants() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _workers(before: set[int]) -> dict[str, int]:
    """The worker processes of the vLLM engine started since `before` (this process's
    descendants then), by their process titles."""
    import psutil

    found = {}
    for p in psutil.Process().children(recursive=True):
        if p.pid in before:  # another engine's (one a caller runs beside)
            continue
        try:
            title = " ".join(p.cmdline()) or p.name()
        except psutil.Error:  # an earlier engine's process, ending
            continue
        if "Worker" in title:
            found[f"worker {len(found)}"] = p.pid
    return found


def run(tp: int = 2, bucket_mb: int = 16, shape: dict | None = None) -> dict:
    cores = max(1, os.cpu_count() or 1)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1",
           # one CPU per worker
           "VLLM_CPU_OMP_THREADS_BIND": "|".join(str(i % cores) for i in range(tp)),
           # every allocation of 64 KiB or more its own mapping, returned when freed:
           # the resident size then follows what is allocated, not what the C
           # allocator keeps
           "MALLOC_MMAP_THRESHOLD_": str(64 << 10)}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update({k: os.environ.get(k) or v for k, v in env.items()})
    try:
        return _measure(tp, bucket_mb, shape)
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _measure(tp: int, bucket_mb: int, shape: dict | None) -> dict:
    # the model's config, in a directory of its own that goes with the measurement
    with tempfile.TemporaryDirectory(prefix="rljob-weight-memory-") as tmp:
        return _measure_in(Path(tmp), tp, bucket_mb, shape)


def _measure_in(tmp: Path, tp: int, bucket_mb: int, shape: dict | None) -> dict:
    import torch

    from rljob.api.spec import ModelSpec, RolloutSpec
    from rljob.inputs.models import build_model, load_tokenizer
    from rljob.infra.netutil import free_port
    from rljob.rollout.vllm_engine import VLLMEngine
    from rljob.weights import WeightReceiver, WeightSender

    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
           "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
           "torch_dtype": "float32", **(shape or SHAPE)}
    (tmp / "config.json").write_text(json.dumps(cfg))
    spec = ModelSpec(path=f"random:{tmp}", tokenizer="builtin:char", dtype="float32")
    tok = load_tokenizer(spec)
    model = build_model(spec, tok, seed=0, dtype=torch.float32)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    model_mb = sum(t.numel() * t.element_size()
                   for t in {t.data_ptr(): t for t in state.values()}.values()) / 1e6
    rows = []
    for version, transport in enumerate(TRANSPORTS, start=1):
        # an engine of its own per transport: memory another update freed and the
        # allocator kept would hide what this one needs
        before = _descendants()
        engine = VLLMEngine(spec, RolloutSpec(engine="vllm", tensor_parallel=tp,
                                              npus_per_replica=tp, max_num_seqs=8),
                            tok, "cpu", seed=0)
        sender = WeightSender(f"127.0.0.1:{free_port()}", transport=transport,
                              bucket_bytes=bucket_mb << 20)
        receiver = WeightReceiver(f"127.0.0.1:{sender.port}", "rollout-0",
                                  transport=transport, backend="gloo")
        try:
            with torch.no_grad():
                for t in state.values():
                    t.add_(1e-3)
            sender.publish(version, state)
            if transport == "collective":  # join first: its set-up is not the update
                receiver._join(engine)
            sampler = RssSampler({"rollout process": os.getpid(), **_workers(before)})
            t0 = time.monotonic()
            assert receiver.load_latest(engine, version, wait=300) == version
            seconds = time.monotonic() - t0
            peaks = sampler.stop()
        finally:
            receiver.stop()
            sender.stop(grace=0)
            engine.close()
        rows.append({"transport": transport, "seconds": round(seconds, 2),
                     "peaks_mb": {n: [round(a), round(t)] for n, (a, t) in peaks.items()}})
    return {"tp": tp, "model_mb": round(model_mb), "bucket_mb": bucket_mb, "rows": rows}


def render(results: dict) -> None:
    print(f"one update of a {results['model_mb']} MB model (float32) to a vLLM replica with "
          f"tensor parallelism {results['tp']}, {results['bucket_mb']} MB buckets: peak "
          "memory growth during the update, MB private (RssAnon) / in all (VmRSS)")
    for row in results["rows"]:
        cells = "  ".join(f"{n} {a}/{t}" for n, (a, t) in row["peaks_mb"].items())
        print(f"  {row['transport']:<10} {row['seconds']:>6.2f} s  {cells}")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--bucket-mb", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = run(args.tp, args.bucket_mb)
    print(json.dumps(results)) if args.json else render(results)


if __name__ == "__main__":
    main()
