"""Faults injected into a real `rljob run` (real processes, real redis-server):
the job finishes, every step trains exactly its own samples once, staleness
stays within its bound, and nothing is left behind.

The quickstart with a 20-step warm-up, 2 rollout replicas, leaseSeconds 3 and a
checkpoint every 2 steps. Each test prints its recovery figure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rljob.api import RLJob
from rljob.contract import TLS_CA_ENV, TOKEN_ENV
from rljob.inputs.data import PromptCursor, load_examples
from rljob.inputs.models import load_tokenizer
from rljob.transferqueue import TransferQueueClient, TransferQueueError
from rljob.trainer.source import prompts_digest
from rljob.workflow.driver import Workflow
from tests.integration.conftest import (
    PASSWORD,
    UNIT_ENV,
    RedisServer,
    admin_client,
    redis_argv,
)

REPO = Path(__file__).resolve().parents[2]
STEPS = 8


def make_job(tmp_path: Path, name: str, **spec_patch) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["metadata"]["name"] = name
    # written elsewhere: the example's paths (relative to examples/) made absolute
    doc["spec"]["model"]["path"] = f"random:{REPO / 'examples/models/tiny-qwen2'}"
    doc["spec"]["dataset"]["path"] = str(REPO / "examples/data/arith.jsonl")
    doc["spec"]["model"]["warmupSteps"] = 20
    doc["spec"]["rollout"]["replicas"] = 2
    doc["spec"]["transferQueue"] = {"leaseSeconds": 3}
    doc["spec"]["trainer"] = {"checkpointEvery": 2}
    for section, values in spec_patch.items():
        doc["spec"].setdefault(section, {}).update(values)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Run:
    """`rljob run` as a user starts it, plus what a test needs to hurt it."""

    def __init__(self, job_file: Path, run_dir: Path, *extra: str):
        self.job_file, self.run_dir = job_file, run_dir
        self.name = yaml.safe_load(job_file.read_text())["metadata"]["name"]
        self.out = open(run_dir.parent / f"{run_dir.name}.out", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rljob", "run", str(job_file), "--run-dir", str(run_dir),
             "--max-steps", str(STEPS), *extra], cwd=REPO, stdout=self.out,
            stderr=subprocess.STDOUT, env=dict(os.environ, **UNIT_ENV))

    def steps(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait_step(self, n: int, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while self.steps() < n:
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, f"no step {n} in {timeout}s\n{self.output()}"
            time.sleep(0.1)

    def worker(self, name: str) -> int:
        """pid of a live worker process of this run (`transferqueue`, `rollout-0`, ...):
        the one logs/NAME.pid names (`rljob run` writes it at each start)."""
        path = self.run_dir / "logs" / f"{name}.pid"
        pid = int(path.read_text()) if path.exists() else None
        if pid not in worker_pids(self.name, self.run_dir):
            raise AssertionError(f"no live {name} of {self.name} (logs/{name}.pid: {pid})")
        return pid

    def wait(self, timeout: float = 420) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.out.close()

    def output(self) -> str:
        if not self.out.closed:
            self.out.flush()
        return (self.run_dir.parent / f"{self.run_dir.name}.out").read_text()[-4000:]

    def events(self) -> str:
        path = self.run_dir / "logs" / "events.log"
        return path.read_text() if path.exists() else ""


def worker_pids(job_name: str, run_dir: Path) -> list[int]:
    """Live processes of a run: each says what it is in its title (infra/proctitle.py):
    the workers `rljob: ROLE ... [JOB]`, the fork server `rljob: fork server [RUN_DIR]`;
    a process not yet titled still has its command line (`... worker ROLE ... JOB_FILE`
    or the fork server's, both naming the run directory or the job)."""
    pids = []
    titled = (f"[{job_name}]".encode(), f"[{run_dir}]".encode())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        cmd = raw.split(b"\0")
        if raw.startswith(b"rljob: "):
            ours = any(t in raw for t in titled)
        else:
            ours = (b"worker" in cmd or b"rljob.infra.forkserver" in cmd) and (
                job_name.encode() in cmd or any(str(run_dir).encode() in c for c in cmd))
        if ours:
            pids.append(int(entry.name))
    return pids


def title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().rstrip()


def expected_digests(job_file: Path, steps: int = STEPS, base: Path | None = None
                     ) -> list[str]:
    """What each step must train: its own prompts, G samples each, in slot order. The
    job's relative paths are read from `base` (default: the job file's directory)."""
    from rljob.preflight import resolve_paths

    job = RLJob.model_validate(yaml.safe_load(job_file.read_text()))
    spec = resolve_paths(job, base or job_file.parent).spec
    os.chdir(REPO)
    tok = load_tokenizer(spec.model)
    flow = Workflow(spec, None, None, tok)
    examples = load_examples(spec.dataset)
    batch = spec.algorithm.step_prompts
    return [prompts_digest(flow.prepare_prompts(
        PromptCursor.at_step(examples, spec.algorithm.seed, s, batch).take(batch))["prompt_ids"])
        for s in range(steps)]


def check(run: Run, code: int = 0, k: int = 1, n: int = 16 * 8) -> list[dict]:
    """The promises: finished, each step trained its own `n` samples exactly once,
    staleness within k, no worker left."""
    assert run.wait() == code, run.output()
    from rljob.local import read_metrics

    ms = read_metrics(run.run_dir)
    assert [m["step"] for m in ms] == list(range(1, STEPS + 1)), run.output()
    assert all(m["samples"] == n and m["rows_claimed"] == n for m in ms), \
        [(m["samples"], m["rows_claimed"]) for m in ms]
    assert [m["prompts"] for m in ms] == expected_digests(run.job_file)
    assert max(m["staleness_max"] for m in ms) <= k
    deadline = time.monotonic() + 10
    while worker_pids(run.name, run.run_dir):
        assert time.monotonic() < deadline, f"workers left behind: {worker_pids(run.name, run.run_dir)}"
        time.sleep(0.2)
    return ms


def recovery(run: Run, at_step: int, t_fault: float) -> float:
    """Seconds from the fault to the first step trained after it."""
    while run.steps() <= at_step and run.proc.poll() is None:
        time.sleep(0.05)
    return time.monotonic() - t_fault


@pytest.fixture
def redis_unit(tmp_path):
    server = RedisServer(tmp_path)
    yield server
    server.stop()


def test_killed_workers_are_restarted_and_the_job_finishes(tmp_path):
    """rollout-0, the driver and trainer-0 SIGKILLed one after another (at steps 2, 4
    and 6, each once the job had trained a step after the last fault): each is
    restarted (the trainer from its checkpoint) and every promise holds for the run."""
    run = Run(make_job(tmp_path, "kill-workers"), tmp_path / "run")
    for at_step, victim in ((2, "rollout-0"), (4, "driver"), (6, "trainer-0")):
        run.wait_step(at_step)
        os.kill(run.worker(victim), signal.SIGKILL)
        t = time.monotonic()
        print(f"\n{victim} SIGKILLed at step {at_step}: next step after "
              f"{recovery(run, at_step, t):.1f}s")
    check(run)
    events = run.events()
    for victim in ("rollout-0", "driver", "trainer-0"):
        assert f"{victim} exited with -9" in events, events


def test_a_trainer_killed_in_sync_restarts_and_the_replicas_held_steps_wait_or_go_back(
        tmp_path):
    """sync: each replica holds the next step's prompts while it generates this one's
    (its claims take a step past its weights). trainer-0 SIGKILLed at step 3 restarts
    from its checkpoint of step 2: the replicas swap to older weights, rows they held
    go back to the queue (or wait for the step's weights), and every step still trains
    its own samples, once, each made by the weights of its own step."""
    job = make_job(tmp_path, "kill-trainer-sync")
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["workflow"] = {"mode": "sync"}  # on-policy: no maxStaleness
    job.write_text(yaml.safe_dump(doc))
    run = Run(job, tmp_path / "run")
    run.wait_step(3)
    os.kill(run.worker("trainer-0"), signal.SIGKILL)
    t = time.monotonic()
    print(f"\ntrainer-0 SIGKILLed at step 3 (sync): next step after "
          f"{recovery(run, 3, t):.1f}s")
    ms = check(run, k=0)
    assert all(m["staleness_max"] == 0 for m in ms)
    assert "trainer-0 exited with -9" in run.events()
    logs = "".join(p.read_text() for p in (run.run_dir / "logs").glob("rollout-*.log"))
    print(f"held batches given back: {logs.count('held rows go back')}")


def test_a_killed_fork_server_takes_its_workers_and_the_job_finishes(tmp_path):
    """The server the CPU workers are forked from (infra/forkserver.py) SIGKILLed
    mid-run: its workers die with it; `rljob run` restarts them as processes of their
    own (the trainer gang from its checkpoint) and every promise holds."""
    run = Run(make_job(tmp_path, "kill-forkserver"), tmp_path / "run")
    run.wait_step(3)
    forked = {n: run.worker(n) for n in ("trainer-0", "rollout-0", "rollout-1", "driver")}
    for name, pid in forked.items():  # forks of the server, titled as their role
        assert Path(f"/proc/{pid}/status").read_text().count(
            f"PPid:\t{run.worker('forkserver')}\n") == 1, name
        role, _, index = name.partition("-")
        assert title(pid).startswith(f"rljob: {role}"), title(pid)
        assert index in title(pid) and "[kill-forkserver]" in title(pid), title(pid)
    os.kill(run.worker("forkserver"), signal.SIGKILL)
    t = time.monotonic()
    print(f"\nfork server SIGKILLed at step 3: next step after {recovery(run, 3, t):.1f}s")
    check(run)
    events = run.events()
    assert "start as processes of their own" in events, events
    for name in forked:
        assert f"{name} exited with -9" in events, events


@pytest.mark.parametrize("cache", ["recompute", "keep"])
def test_interrupting_updates_keep_every_promise_through_a_killed_replica(tmp_path, cache):
    """workflow.weightUpdate interrupt on a generation-bound job (no warm-up: the
    random policy writes the 64 tokens it may; 2 prompts a step, so training is
    short: a replica generates each step right as the weights that may generate it
    come, and a job whose training outlasts its generation leaves nothing to
    interrupt), so updates arrive mid-generation: samples go on under newer weights
    midway (their prefix computed again, or on the cache they had: interruptCache),
    and with rollout-0 SIGKILLed at step 3 every step still trains its own samples
    once, and every token's weights are within the staleness bound."""
    run = Run(make_job(tmp_path, f"interrupt-{cache}-kill", model={"warmupSteps": 0},
                       algorithm={"promptsPerStep": 2, "samplesPerMicroBatch": 16},
                       rollout={"maxNewTokens": 56},
                       workflow={"weightUpdate": "interrupt", "interruptCache": cache}),
              tmp_path / "run")
    run.wait_step(3)
    os.kill(run.worker("rollout-0"), signal.SIGKILL)
    t = time.monotonic()
    print(f"\nrollout-0 SIGKILLed at step 3 (interrupting updates): next step after "
          f"{recovery(run, 3, t):.1f}s")
    ms = check(run, n=2 * 8)
    interrupted = [m["interrupted"] for m in ms]
    tokens = {int(k) for m in ms for k in m["staleness_tokens"]}
    print(f"samples an update interrupted, per step: {interrupted}; token staleness "
          f"seen: {sorted(tokens)}")
    assert sum(interrupted) > 0
    assert tokens <= {0, 1}
    assert all(sum(m["staleness_tokens"].values()) == m["tokens"] for m in ms)
    kept = sum(m["kept_cache_tokens"] for m in ms)
    print(f"tokens on a kept cache: {kept}")
    assert (kept > 0) == (cache == "keep")


def test_a_killed_transferqueue_controller_on_memory_restarts_the_job(tmp_path):
    """Its table was in its own memory: the job restarts from its checkpoint."""
    run = Run(make_job(tmp_path, "kill-tq-memory"), tmp_path / "run")
    run.wait_step(3)
    os.kill(run.worker("transferqueue"), signal.SIGKILL)
    t = time.monotonic()
    print(f"\ntransferqueue (memory) SIGKILLed at step 3: next step after "
          f"{recovery(run, 3, t):.1f}s")
    check(run)
    assert "restarting the job from step" in run.events()


def test_redis_restarted_empty_restarts_the_job_from_its_checkpoint(tmp_path, redis_unit):
    run = Run(make_job(tmp_path, "kill-redis"), tmp_path / "run", "--redis", redis_unit.url)
    run.wait_step(3)
    port = redis_unit.port
    redis_unit.proc.kill()
    redis_unit.proc.wait()
    t = time.monotonic()
    time.sleep(1.0)
    again = subprocess.Popen(redis_argv(port, tmp_path), stdout=subprocess.DEVNULL)
    try:
        print(f"\nredis-server killed at step 3, restarted empty: next step after "
              f"{recovery(run, 3, t):.1f}s")
        check(run)
        assert "restarting the job from step" in run.events()
        assert admin_client(port).dbsize() == 0
    finally:
        again.terminate()
        again.wait()


def test_a_killed_controller_and_redis_on_its_append_only_file_keep_the_table(tmp_path):
    """The table in Redis, as the operator runs it (a StatefulSet on its append-only
    file): the controller SIGKILLed at step 2 finds its table and journal there; then
    redis-server SIGKILLed at step 4 and restarted on its append-only file, and the
    controller finds them again. No job restart."""
    unit = RedisServer(tmp_path, appendonly=True)
    run = Run(make_job(tmp_path, "kill-tq-redis"), tmp_path / "run", "--redis", unit.url)
    try:
        run.wait_step(2)
        os.kill(run.worker("transferqueue"), signal.SIGKILL)
        t = time.monotonic()
        print(f"\ntransferqueue (redis) SIGKILLed at step 2: next step after "
              f"{recovery(run, 2, t):.1f}s")
        run.wait_step(4)
        unit.proc.kill()
        unit.proc.wait()
        t = time.monotonic()
        time.sleep(1.0)
        unit = RedisServer(tmp_path, appendonly=True, port=unit.port)
        print(f"redis-server SIGKILLed at step 4, restarted on its AOF: next step after "
              f"{recovery(run, 4, t):.1f}s")
        check(run)
        events = run.events()
        assert "transferqueue restarted with its table" in events, events
        assert "restarting the job" not in events, events
        assert unit.client.dbsize() == 0, unit.client.keys("*")[:10]
    finally:
        unit.stop()


def test_a_paused_rollout_cannot_publish_stale_samples(tmp_path, monkeypatch):
    run = Run(make_job(tmp_path, "pause"), tmp_path / "run")
    run.wait_step(2)
    victim = run.worker("rollout-0")
    # stop it while it holds rows under lease (not between two claims)
    log = (run.run_dir / "logs/transferqueue.log").read_text()
    address = log[log.rindex("listening on "):].split()[2]
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    # the run's servers speak TLS on a CA made for the run (transferQueue.tls)
    monkeypatch.setenv(TLS_CA_ENV, (run.run_dir / "ca.crt").read_text())
    with pytest.raises(TransferQueueError, match="UNAUTHENTICATED"):  # an outsider
        TransferQueueClient(address, PASSWORD)
    monkeypatch.setenv(TOKEN_ENV, (run.run_dir / "token").read_text())  # the run's token
    tq = TransferQueueClient(address, PASSWORD)

    def holds() -> bool:
        return any(c.consumer == "rollout-0" and c.claimed for c in tq.stats().consumers)

    # a batch takes it ~0.1 s: it may ack between the look and the stop, so the stop
    # counts once the table still shows its claim with the process stopped (it can
    # neither ack nor extend then; an ack already sent has landed after 0.2 s)
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "rollout-0 never stopped holding a claim"
        if not holds():
            time.sleep(0.02)
            continue
        os.kill(victim, signal.SIGSTOP)
        time.sleep(0.2)
        if holds():
            break
        os.kill(victim, signal.SIGCONT)
    tq.close()
    time.sleep(3 * 3)  # three lease terms: its rows went to rollout-1
    os.kill(victim, signal.SIGCONT)
    check(run, k=1)
    log = (run.run_dir / "logs" / "rollout-0.log").read_text()
    # refused either by its lease (expired, rows given to rollout-1) or because the rows
    # were already trained and cleared by the time it woke up
    assert "dropped" in log, log[-2000:]
    assert "is not held" in log or "no longer in the table" in log, log[-2000:]
    assert "rollout-0 exited" not in run.events()  # it dropped the work and went on

def test_ctrl_c_in_the_warm_up_stops_the_run_within_seconds(tmp_path):
    """Ctrl-C before the first RL step: the trainer leaves its warm-up between two
    steps, every worker goes, and the run says there is nothing to resume."""
    job_file = make_job(tmp_path, "int-warmup")
    doc = yaml.safe_load(job_file.read_text())
    doc["spec"]["model"]["warmupSteps"] = 5000  # minutes of warm-up, were it not stopped
    job_file.write_text(yaml.safe_dump(doc))
    run = Run(job_file, tmp_path / "run")
    progress = run.run_dir / "warmup.json"
    deadline = time.monotonic() + 180
    while not (progress.exists() and progress.read_text().strip()):
        assert run.proc.poll() is None, run.output()
        assert time.monotonic() < deadline, "the warm-up never reported\n" + run.output()
        time.sleep(0.1)
    t0 = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(120) == 130, run.output()
    took = time.monotonic() - t0
    out = run.output()
    assert "before the first RL step" in out and "--resume" not in out, out
    assert not worker_pids(run.name, run.run_dir)
    assert "stopped in the warm-up at step" in (run.run_dir / "logs/trainer-0.log").read_text()
    # the other workers wait on the trainer; none holds the stop up by seconds
    assert took < 20, f"{took:.1f}s from Ctrl-C to the end\n{out}"


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                      (signal.SIGHUP, 129)])
def test_an_interrupted_run_stops_everything_checkpoints_and_resumes(tmp_path, sig, code):
    job_file = make_job(tmp_path, f"int-{sig.name.lower()}", trainer={"checkpointEvery": 50})
    run = Run(job_file, tmp_path / "run")
    run.wait_step(3)
    run.proc.send_signal(sig)
    assert run.wait(120) == code, run.output()
    out = run.output()
    assert "final/" not in out and "--resume" in out, out
    assert not worker_pids(run.name, run.run_dir)
    # no checkpoint was due (every 50 steps): the trainer wrote one as it stopped
    assert list((run.run_dir / "checkpoints").glob("step-*/trainer.pt"))
    if sig != signal.SIGTERM:  # the checkpoint is the same whichever signal wrote it:
        return  # resuming from it is run once
    again = Run(job_file, tmp_path / "run", "--resume", str(tmp_path / "run"))
    check(again)


def _alive(pid: int) -> bool:
    """Running, or about to (a zombie has ended: only its exit status is left)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def test_a_sigkilled_run_takes_every_process_it_started_within_seconds(tmp_path):
    """`rljob run` SIGKILLed mid-run (the OOM killer, kill -9): its fork server, its
    workers and what they started are gone within 5 s (each has a death signal, then
    a bounded stop), and `ps` named each one's role while it ran."""
    run = Run(make_job(tmp_path, "kill-run"), tmp_path / "run")
    run.wait_step(2)
    titles = {"transferqueue": "rljob: transferqueue [kill-run]",
              "forkserver": f"rljob: fork server [{run.run_dir}]",
              "trainer-0": "rljob: trainer rank 0/1 [kill-run]",
              "rollout-0": "rljob: rollout replica 0 [kill-run]",
              "rollout-1": "rljob: rollout replica 1 [kill-run]",
              "driver": "rljob: driver [kill-run]"}
    for name, want in titles.items():
        assert title(run.worker(name)) == want, name
    everyone = _descendants(run.proc.pid)
    assert len(everyone) >= len(titles), everyone
    run.proc.kill()
    t0 = time.monotonic()
    while left := [p for p in everyone if _alive(p)]:
        took = time.monotonic() - t0
        assert took < 5, f"{took:.1f}s after the SIGKILL: {[(p, title(p)) for p in left]}"
        time.sleep(0.05)
    took = time.monotonic() - t0
    run.wait(10)
    print(f"\n`rljob run` SIGKILLed at step 2: its {len(everyone)} processes gone in {took:.2f}s")
    assert not worker_pids(run.name, run.run_dir)


class Scorer:
    """arith_partial served on reward.url's protocol in this process, each call `delay`
    late (with `key`: refused without it); `hang`: a socket that takes calls and never
    answers."""

    def __init__(self, delay: float = 0.0, hang: bool = False, key: str | None = None):
        import socket
        import threading

        from rljob.reward import get_reward
        from rljob.reward.server import make_server

        self.server = self.socket = None
        if hang:
            self.socket = socket.socket()
            self.socket.bind(("127.0.0.1", 0))
            self.socket.listen(1024)
            port = self.socket.getsockname()[1]
        else:
            rule = get_reward("arith_partial")

            def slow(prompt, response, answer):
                time.sleep(delay)
                return rule(prompt, response, answer)

            self.server = make_server(slow, key=key)
            threading.Thread(target=self.server.serve_forever, daemon=True).start()
            port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{port}/score"

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.socket is not None:
            self.socket.close()


def test_a_killed_reward_replica_is_restarted_and_its_rows_are_scored(tmp_path, monkeypatch):
    """reward.url with two reward replicas, the service's calls 20 ms each (a batch is
    in hand most of the time), its API key from the run's environment: reward-0
    SIGKILLed at step 2 and step 5 is restarted, the rows it held are scored by the
    other or its next life, and every step trains the service's rewards, which are its
    rule's (nothing lost, nothing defaulted). The key reached the service (it refuses a
    call without it) and no file of the run."""
    key = "rm-key-5f1c9a"
    monkeypatch.setenv("RLJOB_REWARD_API_KEY", key)
    scorer = Scorer(delay=0.02, key=key)
    try:
        run = Run(make_job(tmp_path, "kill-reward", reward={
            "name": "arith_partial", "replicas": 2, "batchSize": 32,
            "url": {"endpoint": scorer.url, "concurrency": 8}}), tmp_path / "run")
        for at_step in (2, 5):
            run.wait_step(at_step)
            os.kill(run.worker("reward-0"), signal.SIGKILL)
            t = time.monotonic()
            print(f"\nreward-0 SIGKILLed at step {at_step}: next step after "
                  f"{recovery(run, at_step, t):.1f}s")
        ms = check(run)
    finally:
        scorer.close()
    assert run.events().count("reward-0 exited with -9") == 2, run.events()
    for m in ms:
        assert m["reward_failed"] == 0 and m["reward_mean"] == m["rule_reward_mean"], m
        assert m["reward_seconds"] > 0
    assert "scored" in (run.run_dir / "logs" / "reward-1.log").read_text()  # shared
    for path in run.run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 64 << 20:
            assert key.encode() not in path.read_bytes(), path


def test_a_hanging_scoring_service_costs_its_time_limits_and_the_job_finishes(tmp_path):
    """A service that takes every call and never answers: each call ends at its time
    limit (0.5 s, one retry), every sample scores failureScore with the error, and
    every step is trained: the job is slower by the limits, never stalled."""
    scorer = Scorer(hang=True)
    try:
        run = Run(make_job(tmp_path, "hang-reward", reward={
            "name": "arith_partial", "batchSize": 128,
            "url": {"endpoint": scorer.url, "concurrency": 128, "timeoutSeconds": 0.5,
                    "maxRetries": 1, "backoffSeconds": 0.1, "failureScore": -1.0}}),
            tmp_path / "run")
        ms = check(run)
    finally:
        scorer.close()
    for m in ms:
        assert m["reward_failed"] == 128 and m["reward_mean"] == -1.0, m
        # the step's rows in at most a few batches, each within 2 x 0.5 s + 0.2 s of waits
        assert m["reward_seconds"] < 4.0, m
    log = (run.run_dir / "logs" / "reward-0.log").read_text()
    assert "reward.url: no answer within 0.5 s (2 attempts)" in log, log[-2000:]
