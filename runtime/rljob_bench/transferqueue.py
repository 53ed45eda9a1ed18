"""`rljob bench transferqueue`: the data plane against the raw Redis ceiling.

Side by side in one run, on one redis-server and one controller process:
- put+get MB/s of 64-row batches (4 KB, 64 KB, 256 KB rows) through
  TransferQueue with 1 and 4 consumer processes (producer in this process);
- the same server's raw pipelined SET and GET MB/s for the same payloads
  (redis-py, zero-copy packer, one MSET / MGET per batch; see raw_pipeline)
  and our ratio to the combined put+get figure, plus redis-benchmark's SET and
  GET MB/s (C client, one hot key) for context;
- claim latency p50/p99 with 8 concurrent consumer processes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack

import numpy as np

from rljob.contract import PASSWORD_ENV, REDIS_USER_ENV, TOKEN_ENV
from rljob.infra.netutil import free_port

ROWS_PER_BATCH = 64
ROW_SIZES = (4 << 10, 64 << 10, 256 << 10)
BYTES_PER_CASE = 512 << 20


def _start_redis(stack: ExitStack, password: str, pems=None, tls_dir: Path | None = None,
                 appendfsync: str = "no") -> str:
    """A redis-server on `password`; with `pems` (infra.tls.Pems), serving TLS alone
    on them (their files in `tls_dir`), as a Redis unit of a job with
    transferQueue.tls does: its rediss:// URL. `appendfsync`: "no" (no append-only
    file) or the append-only file synced "always" (as a job's units run) or
    "everysec"."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found: install it (Debian: apt-get install redis-server) "
                         "or pass --redis URL")
    port = free_port()
    workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="rljob-bench-redis-"))
    listen = ["--port", str(port)]
    if pems is not None:
        from rljob.api.builders.transferqueue import redis_tls_args
        from rljob.contract import CA_FILE, CERT_FILE, KEY_FILE

        for name, pem in ((CA_FILE, pems.ca), (CERT_FILE, pems.cert), (KEY_FILE, pems.key)):
            (tls_dir / name).write_text(pem)
        listen = redis_tls_args(str(tls_dir), port)
    from rljob.api.builders.transferqueue import redis_aof_args

    aof = ["--appendonly", "no"] if appendfsync == "no" else redis_aof_args(appendfsync)
    proc = subprocess.Popen([exe, *listen, "--bind", "127.0.0.1", "--save", "", *aof,
                             "--requirepass", password, "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    stack.callback(lambda: (proc.terminate(), proc.wait()))
    import redis

    from rljob.infra.tls import redis_client_kwargs

    url = f"{'rediss' if pems is not None else 'redis'}://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, password=password,
                                  **redis_client_kwargs(url, pems.ca if pems else None))
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    return url


def _start_controller(stack: ExitStack, redis_url: str, password: str,
                      token: str | None = None, job: str = "bench",
                      env: dict[str, str] | None = None) -> str:
    """A controller of `job` on `redis_url`; with `token`, one that answers only
    callers that present it (infra/auth.py), as a job's does; `env` added to its
    environment (the job's TLS certificate: infra/tls.py)."""
    address = f"127.0.0.1:{free_port()}"
    extra = env or {}
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env.update({PASSWORD_ENV: password, **({TOKEN_ENV: token} if token else {}), **extra})
    proc = subprocess.Popen([sys.executable, "-m", "rljob", "worker", "transferqueue",
                             "--listen", address, "--redis", redis_url, "--job", job,
                             "--log-level", "WARNING", "--max-row-bytes", str(16 << 20)],
                            env=env, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening" not in line:
        raise SystemExit(f"transferqueue controller did not start: {line}")
    stack.callback(lambda: (proc.send_signal(signal.SIGTERM), proc.wait()))
    return address


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# ---- raw redis ceiling -------------------------------------------------------
def raw_pipeline(redis_url: str, password: str, row_bytes: int, batches: int) -> dict:
    """The same batches straight to redis with redis-py (zero-copy packer), no TransferQueue.

    `set` and `get`: MB/s of pipelined MSET of every batch (64 fresh keys each),
    then MGET (+UNLINK) of every batch, as redis-benchmark runs SET then GET;
    `put_get`: the same bytes written and read, 1 / (1/set + 1/get), the figure
    our put+get is compared with. `interleaved`: MSET, MGET and UNLINK of one
    batch after the other, each batch read back while still in the CPU cache,
    a best case no pipeline with queued data reaches (reported for context).
    """
    from rljob.transferqueue.storage.redis_unit import RedisUnit
    from rljob.transferqueue.units import redis_user

    unit = RedisUnit(redis_url, job="raw", password=password, username=redis_user())
    views = [memoryview(np.random.bytes(row_bytes)) for _ in range(ROWS_PER_BATCH)]
    keys = [[f"raw:{b}:{i}".encode() for i in range(ROWS_PER_BATCH)] for b in range(batches)]

    def mset(b):
        unit.client.execute_command("MSET", *[x for kv in zip(keys[b], views) for x in kv])

    def mget_unlink(b):
        got = unit.client.execute_command("MGET", *keys[b])
        if len(got[-1]) != row_bytes:
            raise RuntimeError("raw MGET returned a short value")
        unit.client.unlink(*keys[b])

    mb = batches * ROWS_PER_BATCH * row_bytes / 1e6
    t0 = time.perf_counter()
    for b in range(batches):
        mset(b)
    t1 = time.perf_counter()
    for b in range(batches):
        mget_unlink(b)
    t2 = time.perf_counter()
    for b in range(batches):
        mset(b)
        mget_unlink(b)
    t3 = time.perf_counter()
    unit.close()
    return {"set": mb / (t1 - t0), "get": mb / (t2 - t1), "put_get": mb / (t2 - t0),
            "interleaved": mb / (t3 - t2)}


def redis_benchmark(redis_url: str, password: str, row_bytes: int) -> dict | None:
    """SET and GET MB/s from redis-benchmark (-P 16 -c 8), for context; None if absent."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return None
    from urllib.parse import urlparse

    u = urlparse(redis_url)
    n = max(2000, min(100_000, (256 << 20) // row_bytes))
    from rljob.transferqueue.units import redis_user

    user = redis_user()
    out = subprocess.run([exe, "-h", u.hostname or "127.0.0.1", "-p", str(u.port or 6379),
                          *(["--user", user] if user else []),
                          "-a", password, "-t", "set,get", "-d", str(row_bytes), "-P", "16",
                          "-c", "8", "-n", str(n), "--csv", "-q"],
                         capture_output=True, text=True, timeout=300)
    rates = {}
    for line in out.stdout.splitlines():
        parts = [p.strip('"') for p in line.split(",")]
        if parts and parts[0] in ("SET", "GET"):
            rates[parts[0].lower()] = float(parts[1]) * row_bytes / 1e6
    if len(rates) != 2:
        return None
    rates["set_then_get"] = 1 / (1 / rates["set"] + 1 / rates["get"])
    return rates


# ---- TransferQueue put+get -----------------------------------------------------
def _consumer(address: str, password: str, task: str, total_rows: int, done, columns,
              ready) -> None:
    """Consume through the stream loader (prefetching, acks after each batch)."""
    from rljob.transferqueue import TransferQueueClient
    from rljob.transferqueue.alloc import tune_allocator
    from rljob.transferqueue.loader import stream_loader

    tune_allocator()
    with TransferQueueClient(address, password) as c:
        c.stats()  # connected
        ready.wait(timeout=120)
        loader = stream_loader(c, task, columns, ROWS_PER_BATCH, wait=0.2, min_count=1,
                               stop_when_idle=0.6, prefetch=1)
        for batch in loader:
            with done.get_lock():
                done.value += len(batch.rows)
    _leave()


def tq_put_get(address: str, password: str, row_bytes: int, batches: int, consumers: int,
               tag: str) -> float:
    """MB/s of rows written by one producer and read by `consumers` processes, end to end."""
    from rljob.transferqueue import TaskSpec, TransferQueueClient, tensor

    ctx = mp.get_context("spawn")
    task = f"consume-{tag}"
    col = f"payload_{tag}"
    with TransferQueueClient(address, password) as c:
        c.register(TaskSpec(f"produce-{tag}", (), [tensor(col, "uint8")]), TaskSpec(task, [col]))
        rows = [np.frombuffer(np.random.bytes(row_bytes), np.uint8) for _ in range(ROWS_PER_BATCH)]
        total = batches * ROWS_PER_BATCH
        done = ctx.Value("q", 0)
        ready = ctx.Barrier(consumers + 1)
        procs = [ctx.Process(target=_consumer,
                             args=(address, password, task, total, done, [col], ready))
                 for _ in range(consumers)]
        for p in procs:
            p.start()
        try:  # every consumer is connected: start the clock
            ready.wait(timeout=120)
        except threading.BrokenBarrierError:
            _join(procs)
            raise RuntimeError(f"a consumer of {tag} did not connect within 120 s (exit codes "
                               f"{[p.exitcode for p in procs]})") from None
        start = time.perf_counter()
        for b in range(batches):
            c.put(b, {col: rows}, wait=False)
        c.flush()
        while done.value < total and any(p.is_alive() for p in procs):
            time.sleep(0.0005)
        elapsed = time.perf_counter() - start
        _join(procs)  # they leave once idle
        if done.value < total:
            raise RuntimeError(f"consumers read {done.value} of {total} rows")
    return total * row_bytes / elapsed / 1e6


# ---- claim latency -----------------------------------------------------------------
def _claimer(address: str, password: str, task: str, claims: int, out) -> None:
    from rljob.transferqueue import TransferQueueClient
    from rljob.transferqueue.alloc import tune_allocator

    tune_allocator()
    lat = []
    with TransferQueueClient(address, password) as c:
        batch = c.claim(task, 1, min_count=1)  # warm the channel
        for _ in range(claims):
            t0 = time.perf_counter()
            batch = c.claim(task, 8, min_count=1, wait=1.0, ack=batch)
            lat.append(time.perf_counter() - t0)
        c.ack(batch)
    out.put(lat)
    out.close()
    out.join_thread()  # the figures are in the pipe
    _leave()


def _leave() -> None:
    """A bench child's end, without Python's finalization: a gRPC call object
    collected there once waited forever on a lock that a thread gone at shutdown
    held, and so did the parent joining it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _join(procs) -> None:
    """Wait for the children; one still there a minute after its work is done is
    killed (its figures are in)."""
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join()


def claim_latency(address: str, password: str, consumers: int = 8, claims: int = 150) -> list[float]:
    from rljob.transferqueue import TaskSpec, TransferQueueClient, tensor

    ctx = mp.get_context("spawn")
    with TransferQueueClient(address, password) as c:
        c.register(TaskSpec("lat-producer", (), [tensor("tok", "int32")]), TaskSpec("lat", ["tok"]))
        need = consumers * (claims + 1) * 8
        for start in range(0, need, 1024):
            c.put(start // 1024, {"tok": [np.arange(16, dtype=np.int32)] * min(1024, need - start)})
        out = ctx.Queue()
        procs = [ctx.Process(target=_claimer, args=(address, password, "lat", claims, out))
                 for _ in range(consumers)]
        for p in procs:
            p.start()
        lat = [x for _ in procs for x in out.get(timeout=300)]
        _join(procs)
    return lat


def run(redis_url: str | None = None, quick: bool = False, appendfsync: str = "always"
        ) -> dict:
    from rljob.transferqueue.alloc import tune_allocator

    tune_allocator()  # every process of the run, raw and ours alike
    password = os.environ.get(PASSWORD_ENV) or "rljob-bench"
    scale = 4 if quick else 1
    with ExitStack() as stack:
        if redis_url is None:  # a Redis of our own, its default user: no ACL user of the env
            user = os.environ.pop(REDIS_USER_ENV, None)
            if user is not None:
                stack.callback(os.environ.__setitem__, REDIS_USER_ENV, user)
        url = redis_url or _start_redis(stack, password, appendfsync=appendfsync)
        address = _start_controller(stack, url, password)
        results: dict = {"appendfsync": "given" if redis_url else appendfsync,
                         "rows_per_batch": ROWS_PER_BATCH, "put_get": {}, "raw": {},
                         "ratio_to_raw": {}}
        for size in ROW_SIZES:
            label = f"{size >> 10}KB"
            batches = max(BYTES_PER_CASE // scale // (size * ROWS_PER_BATCH), 4)
            raw = raw_pipeline(url, password, size, batches)
            ours = {f"{n}_consumers": tq_put_get(address, password, size, batches, n, f"{label}x{n}")
                    for n in (1, 4)}
            results["raw"][label] = raw
            results["put_get"][label] = ours
            results["ratio_to_raw"][label] = ours["1_consumers"] / raw["put_get"]
            results.setdefault("ratio_to_interleaved", {})[label] = (
                ours["1_consumers"] / raw["interleaved"])
            bench = redis_benchmark(url, password, size)
            if bench:
                results.setdefault("redis_benchmark", {})[label] = bench
        lat = claim_latency(address, password, claims=40 if quick else 150)
        results["claim_latency_ms"] = {"consumers": 8, "p50": _percentile(lat, 50) * 1e3,
                                       "p99": _percentile(lat, 99) * 1e3, "claims": len(lat)}
    return results


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"TransferQueue put+get vs raw redis, MB/s ({results['rows_per_batch']}-row batches)")
    for col in ("row", "TQ 1 consumer", "TQ 4 consumers", "raw SET / GET", "raw put+get",
                "ratio", "raw interleaved (ratio)", "redis-benchmark SET / GET"):
        # all MB/s; ratio = TQ 1 consumer / raw put+get
        table.add_column(col, justify="right")
    rb = results.get("redis_benchmark", {})
    for label, ours in results["put_get"].items():
        raw = results["raw"][label]
        ctx = f"{rb[label]['set']:.0f} / {rb[label]['get']:.0f}" if label in rb else "n/a"
        table.add_row(label, f"{ours['1_consumers']:.0f}", f"{ours['4_consumers']:.0f}",
                      f"{raw['set']:.0f} / {raw['get']:.0f}", f"{raw['put_get']:.0f}",
                      f"{results['ratio_to_raw'][label]:.2f}",
                      f"{raw['interleaved']:.0f} ({results['ratio_to_interleaved'][label]:.2f})",
                      ctx)
    console = Console(width=max(Console().width, 132))
    console.print(table)
    lat = results["claim_latency_ms"]
    console.print(f"claim latency with {lat['consumers']} concurrent consumers: "
                  f"p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms ({lat['claims']} claims)")
