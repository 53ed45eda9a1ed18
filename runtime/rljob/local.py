"""`rljob run FILE`: the whole job as local processes, the embedded default.

The same entrypoints as the pods: `rljob worker transferqueue`, `rljob worker
trainer` (one per rank; DDP over gloo when there is more than one),
`rljob worker rollout` (one per replica) and `rljob worker driver`; the CPU ones
forked from one parent that imported torch and transformers once
(infra/forkserver.py; RLJOB_FORK_WORKERS=0: each a process of its own). The run
directory gets job.yaml, metrics.jsonl, spans/, checkpoints/, final/ (weights),
reward.png and timeline.png.

`supervise()` gives the processes pod semantics: a worker that exits
abnormally is restarted after a backoff, up to `runPolicy.backoffLimit`
restarts per worker; a dead trainer rank restarts the whole gang from the last
checkpoint; a TransferQueue controller that comes back without its table
(memory units, or a Redis that restarted empty) restarts the job from the last
checkpoint. Every child dies with `rljob run` (PR_SET_PDEATHSIG), however it ends.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .api import RLJob
from .api.builders import reward_replicas
from .contract import LIFELINE_ENV, PASSWORD_ENV, TOKEN_ENV, worker_argv
from .infra import auth, tls
from .infra.cores import Layout, write_layout
from .infra.device import CORES_ENV
from .infra.devices import count as count_devices, device_plan, worker_env
from .infra.forkserver import (ForkServer, ForkServerGone, Forked, die_with_parent,
                               preload_modules)
from .infra.netutil import free_port
from .infra.rundir import RunDir
from .infra.torchprof import ENV as TORCH_PROFILE_ENV
from .inputs.models import model_config

DRIVER_GRACE_S = 10.0  # seconds the driver may take to end once every trainer rank exited
VLLM_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # how vLLM's CPU workers bind their threads


# spec fields only the operator applies (pods, volumes, scheduling, cluster resources)
CLUSTER_ONLY = ("image", "suspend", "scheduling", "runPolicy.activeDeadlineSeconds",
                "runPolicy.ttlSecondsAfterFinished",
                "runPolicy.notReadyTolerationSeconds", "model.pvc", "dataset.pvc",
                "rollout.resources", "rollout.autoscaling", "trainer.resources",
                "trainer.checkpointPvc", "transferQueue.storageUnits", "transferQueue.redis",
                "transferQueue.resources", "transferQueue.driverResources",
                "accelerator.resourceName", "accelerator.nodeSelector", "accelerator.hccl",
                "podTemplateOverrides", "managedBy", "reward.resources",
                "reward.url.apiKeySecret", "reward.model.pvc")


def cluster_only_fields(job: RLJob) -> list[str]:
    """The fields the job sets, to other than their defaults, that a local run does not
    apply (pure). A resumed run's job.yaml writes every field out; only those that
    differ from their defaults were the user's."""
    written = job.spec.model_dump(exclude_unset=True, exclude_none=True, by_alias=True)
    defaults = type(job.spec).model_validate(
        {"model": {"path": "-"}, "dataset": {"path": "-"}}).model_dump(exclude_none=True,
                                                                       by_alias=True)

    def at(tree: dict, path: str):
        node = tree
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                return _ABSENT
            node = node[key]
        return node

    return [f"spec.{p}" for p in CLUSTER_ONLY
            if at(written, p) is not _ABSENT and at(written, p) != at(defaults, p)]


_ABSENT = object()


# an engine's child process prefixes its log lines: "(Worker pid=7) ERROR 11-26 12:03:33 [f.py:1] "
_PREFIX = re.compile(r"^\(\S+ pid=\d+\) (?:\S+ )?(?:\d\d-\d\d \S+ )?(?:\[\S+\] )?")
_ERROR = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b(?::.*)?$")


def failure_cause(log: str) -> str | None:
    """The error that ended a worker's life: the last line of the last Python
    traceback in its log (None: no traceback, e.g. killed by a signal), and where
    an earlier error led to it (an engine's child process that failed first, a
    chained exception), that first error too."""
    at = log.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    lines = [x for x in log[at:].splitlines()[1:] if x.strip()]
    ends = [x for x in lines if not x.startswith((" ", "\t"))]
    if not ends:
        return None
    last = ends[-1].strip()
    errors = [m for m in (_PREFIX.sub("", x).strip() for x in log.splitlines()) if _ERROR.match(m)]
    first = errors[0] if errors else last
    cause = last if first == last else f"{last} (first error: {first})"
    return cause[:400]


def _die_with_parent(cpus: set[int] | None):
    """preexec_fn: the child gets SIGTERM when `rljob run` goes, however it goes."""
    def setup() -> None:
        die_with_parent(signal.SIGTERM)
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


def pin_cores_default() -> bool:
    """Whether `rljob run` pins its workers to cores: yes unless RLJOB_PIN_CORES says
    0/false (several runs, or other work, share the machine: pinned, each run's
    trainer would take the same first core)."""
    return _env_on("RLJOB_PIN_CORES")


def _env_on(name: str) -> bool:
    """An on/off environment variable, on unless it says off as the command line's
    flags read it (0, false, no, n, off, f)."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "n", "off", "f")


class JobFailed(RuntimeError):
    """A worker failed more often than runPolicy.backoffLimit allows."""


@dataclass
class LocalRun:
    job: RLJob
    run_dir: Path
    redis: list[str] = field(default_factory=list)
    max_steps: int | None = None
    resume: bool = False
    procs: dict[str, subprocess.Popen | Forked] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    backoff_base: float = 1.0
    lend_cores: bool = False  # a waiting side's cores serve the other (infra/cores.py)
    # FIRST-LAST: torch's profiler over those steps in the compute workers (infra/torchprof.py)
    torch_profile: str | None = None
    # each compute worker on cores of its own (cpus_for); off (RLJOB_PIN_CORES=0): it
    # gets their count only, and the OS places it. Lending cores pins regardless.
    pin_cores: bool = field(default_factory=pin_cores_default)
    # CPU workers forked from one pre-imported parent (infra/forkserver.py); off
    # (RLJOB_FORK_WORKERS=0): each a process of its own, as in a pod
    fork_workers: bool = field(default_factory=lambda: _env_on("RLJOB_FORK_WORKERS"))
    # the run's token: its servers answer only its workers (infra/auth.py), as a job's
    # pods in a cluster
    token: str = field(default_factory=auth.new_token, repr=False)
    # with transferQueue.tls, the run's CA and its servers' certificate (infra/tls.py)
    pems: tls.Pems | None = field(default=None, repr=False)
    _devices: dict | None = None  # worker -> its accelerators (`devices`)
    _pending: dict[str, float] = field(default_factory=dict)  # worker -> restart time
    _args: dict[str, list[str]] = field(default_factory=dict)  # worker -> its command line
    _life: dict[str, int] = field(default_factory=dict)  # worker -> its log's offset
    # where its life began
    _causes: dict[str, tuple[str, int]] = field(default_factory=dict)  # worker -> (cause,
    # steps done) of its last failure
    _forks: ForkServer | None = None  # the workers' pre-imported parent (start())
    _trained_at: float | None = None  # when every trainer rank had exited 0

    @property
    def steps(self) -> int:
        return self.max_steps or self.job.spec.algorithm.max_steps

    def cpus_for(self, name: str) -> set[int] | None:
        """Trainer ranks and rollout replicas each get cores of their own: a block of
        the machine's cores each (trainers first, the remainder to the first ones),
        or one core round robin when there are fewer cores than busy workers, so
        busy workers do not bounce between cores. Each computes with as many threads
        as cores it got. The light processes (controller, driver) share the last
        core, away from the trainer, whose step ends every pipeline stage."""
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if len(cpus) < 2:
            return None
        spec = self.job.spec
        order = [f"trainer-{r}" for r in range(spec.trainer.world_size)] + \
                [f"rollout-{i}" for i in range(spec.rollout.replicas)]
        if name not in order:
            return {cpus[-1]}
        i = order.index(name)
        if len(cpus) <= len(order):
            return {cpus[i % len(cpus)]}
        per, extra = divmod(len(cpus), len(order))
        start = i * per + min(i, extra)
        return set(cpus[start:start + per + (1 if i < extra else 0)])

    def core_layout(self) -> Layout | None:
        """The compute workers and their cores, where idle ones are lent: every
        worker with cores of its own, the torch trainer and the hf engine (whose
        threads are torch's; vLLM runs its own)."""
        spec = self.job.spec
        if not self.lend_cores or spec.trainer.engine != "torch" or \
                spec.rollout.engine != "hf":
            return None
        workers = [f"trainer-{r}" for r in range(spec.trainer.world_size)] + \
                  [f"rollout-{i}" for i in range(spec.rollout.replicas)]
        cores = [self.cpus_for(w) for w in workers]
        if any(c is None for c in cores):
            return None
        return Layout(tuple(workers), tuple(tuple(sorted(c)) for c in cores))

    @property
    def devices(self) -> dict[str, tuple[int, ...]]:
        """worker → its accelerators on this host (infra/devices.py), planned once."""
        if self._devices is None:
            spec = self.job.spec
            kinds = {spec.accelerator_for(r).type for r in ("trainer", "rollout")} - {"cpu"}
            available = sum(count_devices(k) for k in kinds)
            self._devices = device_plan(spec, available) if kinds else {}
        return self._devices

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        # POD_NAME: the worker's name in TransferQueue, the same in every life of it
        cpus = self.cpus_for(name)
        threads = str(len(cpus) if cpus else 1)
        role = name.split("-")[0]
        kind = self.job.spec.accelerator_for(role).type if role in ("trainer", "rollout") \
            else "cpu"
        env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
                   PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", POD_NAME=name,
                   **{TOKEN_ENV: self.token, LIFELINE_ENV: "1"},
                   **(self.pems.env() if self.pems else {}),
                   **worker_env(kind, self.devices.get(name, ())))
        env.pop(CORES_ENV, None)  # pinned, its cores are its affinity, not a count of ours
        if self.torch_profile:
            env[TORCH_PROFILE_ENV] = self.torch_profile
        if not (self.pin_cores or self.lend_cores):  # placed by the OS, its count of threads
            env[CORES_ENV] = threads
            # vLLM's CPU workers too, with this count of threads: its automatic binding
            # (0.32, utils/ompmultiprocessing.py) binds a thread to each core of the
            # process's affinity but one, the same cores for every unpinned engine on
            # the machine, whatever count the worker was given; a user's setting stays
            env.setdefault(VLLM_BIND_ENV, "nobind")
            cpus = None
        self.layout.logs.mkdir(parents=True, exist_ok=True)
        log = self.layout.log(name)
        self._life[name] = log.stat().st_size if log.exists() else 0
        # its own session: a terminal's Ctrl-C reaches `rljob run` only, which
        # stops the workers in order (the trainer checkpoints first)
        proc = self._fork(name, kind, args, env, log, cpus)
        if proc is None:
            with open(log, "ab") as out:
                proc = subprocess.Popen([sys.executable, "-m", "rljob", *args], env=env,
                                        stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True,
                                        preexec_fn=_die_with_parent(cpus))
        self.procs[name] = proc
        self._args[name] = args
        self.layout.pid_file(name).write_text(f"{proc.pid}\n")
        return proc

    def _fork(self, name: str, kind: str, args: list[str], env: dict[str, str], log: Path,
              cpus: set[int] | None) -> Forked | None:
        """The worker forked from the run's fork server (infra/forkserver.py): the CPU
        trainer ranks, hf replicas and driver, which import torch and transformers
        (vLLM's engine and accelerators start in processes of their own). None: start
        it the usual way."""
        role = name.split("-")[0]
        if self._forks is None or kind != "cpu" or role not in ("trainer", "rollout", "driver") \
                or (role == "rollout" and self.job.spec.rollout.engine != "hf"):
            return None
        try:
            return self._forks.spawn(args, env, log, cpus)
        except ForkServerGone as exc:
            self.event(f"{exc}: {name} and later workers start as processes of their own")
            self._forks.close()
            self._forks = None
            return None

    def _start_forkserver(self) -> None:
        standing = os.environ.get("RLJOB_FORK_SERVER")
        if standing:  # a standing server many runs share (its imports done once)
            pid_file = self.layout.pid_file("forkserver")
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._forks = ForkServer.connect(standing)
                pid_file.write_text(f"{self._forks.pid}\n")
                return
            except ForkServerGone as exc:
                self.event(f"{exc}: this run starts a fork server of its own")
        try:
            config = model_config(self.job.spec.model)
        except (OSError, ValueError):
            config = None  # preflight says what is wrong with it
        try:
            self._forks = ForkServer(self.run_dir, preload_modules(
                (config or {}).get("model_type")), self.layout.log("forkserver"))
            self.layout.pid_file("forkserver").write_text(f"{self._forks.pid}\n")
        except OSError as exc:
            self.event(f"no fork server ({exc}): workers start as processes of their own")
            self._forks = None

    @property
    def layout(self) -> RunDir:
        return RunDir(self.run_dir)

    @property
    def job_name(self) -> str:
        return self.job.metadata.name or "rljob"

    def start(self) -> None:
        spec = self.job.spec
        self.run_dir.mkdir(parents=True, exist_ok=True)
        job_file = self.layout.job_file
        if not (self.resume and job_file.exists()):
            job_file.write_text(yaml.safe_dump(self.job.to_wire(), sort_keys=False))
        token_file = self.layout.token
        token_file.unlink(missing_ok=True)
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.token)
        self.layout.ca.unlink(missing_ok=True)
        if spec.transfer_queue.tls:  # what a tool of this machine trusts to reach the run
            self.pems = self.pems or tls.make()
            self.layout.ca.write_text(self.pems.ca)
        self.tq_address = f"127.0.0.1:{free_port()}"
        self.weights_address = f"127.0.0.1:{free_port()}"
        self._common = {"job": job_file, "run_dir": self.run_dir}
        tq_args = worker_argv("transferqueue", listen=self.tq_address, job=self.job_name,
                              redis=self.redis, log_level="WARNING",
                              lease_seconds=spec.transfer_queue.lease_seconds)
        self.purge_storage()  # a fresh or resumed run starts from a checkpoint, not a table
        if not self.resume:  # an earlier run's reference is not this one's
            self.layout.reference.unlink(missing_ok=True)
        write_layout(self.run_dir, self.core_layout())
        if self.fork_workers and self._forks is None:  # it imports while the
            # transferqueue starts
            self._start_forkserver()
        tq = self._spawn("transferqueue", tq_args)
        self._wait_listening(tq, "transferqueue")
        self._start_job(resume=self.resume)

    def _start_job(self, resume: bool) -> None:
        """Trainer gang, rollouts and driver (the transferqueue is up)."""
        spec = self.job.spec
        self.start_gang(resume)
        for i in range(spec.rollout.replicas):
            self._spawn(f"rollout-{i}", worker_argv(
                "rollout", **self._common, tq=self.tq_address, weights=self.weights_address,
                replica=i))
        for i in range(reward_replicas(self.job)):
            self._spawn(f"reward-{i}", worker_argv("reward", **self._common,
                                                   tq=self.tq_address, replica=i))
        start_step = self.resume_step() if resume else 0
        self._spawn("driver", worker_argv(
            "driver", **self._common, max_steps=self.steps, tq=self.tq_address,
            weights=self.weights_address, start_step=start_step))

    def start_gang(self, resume: bool) -> None:
        """Every trainer rank; with `resume`, from the run's last checkpoint."""
        world = self.job.spec.trainer.world_size
        master = f"127.0.0.1:{free_port()}"  # a fresh rendezvous for every life of the gang
        for r in range(world):
            self._spawn(f"trainer-{r}", worker_argv(
                "trainer", **self._common, max_steps=self.steps, tq=self.tq_address,
                weights_listen=self.weights_address, world_size=world, master=master, rank=r,
                resume=resume))

    def resume_step(self) -> int:
        return max(self.layout.checkpoint_steps(), default=0)

    def _wait_listening(self, proc: subprocess.Popen, name: str, timeout: float = 60) -> str:
        """Wait for a server's 'listening' line (the last one: earlier lives wrote theirs)."""
        log = self.layout.log(name)
        before = log.read_text(errors="replace").count("listening on") if log.exists() else 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            if text.count("listening on") > before:
                return text[text.rindex("listening on"):].split("\n", 1)[0]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {text[-2000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{name} did not start within {timeout}s")

    # ---- supervision ------------------------------------------------------
    def event(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        self.events.append(line)
        with open(self.layout.events_log, "a") as f:
            f.write(line + "\n")

    def _tail(self, name: str) -> str:
        path = self.layout.log(name)
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def supervise(self) -> bool:
        """One look at the workers: restart the ones that died. True once the job is done
        (every trainer rank exited 0); raises JobFailed past the backoff limit."""
        limit = self.job.spec.run_policy.backoff_limit
        now = time.monotonic()
        trainers = [n for n in self.procs if n.startswith("trainer-")]
        if trainers and all(self.procs[n].poll() == 0 for n in trainers):
            # the driver ends on its own once the last version is out (it logs what its
            # ranker learned on the way): a few seconds' grace before it is stopped
            self._trained_at = self._trained_at or now
            driver = self.procs.get("driver")
            return driver is None or driver.poll() is not None \
                or now - self._trained_at > DRIVER_GRACE_S
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or name in self._pending:
                continue
            if code == 0 and not name.startswith("rollout-"):
                continue  # the driver released everything; a trainer rank finished
            self._same_failure_again(name)
            n = self.restarts.get(name, 0) + 1
            if n > limit:
                raise JobFailed(f"{name} exited with {code} after {n - 1} restart(s) "
                                f"(runPolicy.backoffLimit {limit}):\n{self._tail(name)}")
            self.restarts[name] = n
            delay = min(self.backoff_base * 2 ** (n - 1), 30.0)
            self._pending[name] = now + delay
            self.event(f"{name} exited with {code}; restart {n}/{limit} in {delay:.0f}s")
        for name, at in list(self._pending.items()):
            if at <= now:
                del self._pending[name]
                self._restart(name)
        return False

    def _steps_done(self) -> int:
        path = self.layout.metrics
        return path.read_bytes().count(b"\n") if path.exists() else 0

    def _same_failure_again(self, name: str) -> None:
        """A worker that fails twice in a row with the same error and no step done in
        between (a checkpoint that cannot load, a broken reward, an engine that cannot
        start) fails the same way however often it restarts: the run ends now, with
        the error's line from the worker's log."""
        offset = self._life.get(name, 0)
        log = self.layout.log(name)
        text = ""
        if log.exists():
            with log.open("rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        cause = failure_cause(text)
        if cause is None:
            self._causes.pop(name, None)  # killed, or no traceback: not the same way
            return
        steps = self._steps_done()
        if self._causes.get(name) == (cause, steps):
            raise JobFailed(f"{name} failed twice the same way with no step done in between: "
                            f"{cause} (logs/{name}.log)")
        self._causes[name] = (cause, steps)

    def _restart(self, name: str) -> None:
        t0 = time.monotonic()
        if name == "transferqueue":
            proc = self._spawn(name, self._args[name])
            line = self._wait_listening(proc, name)
            if "recovered" in line:
                self.event(f"transferqueue restarted with its table ({time.monotonic() - t0:.1f}s)")
                return
            # the table is gone (memory units, an emptied Redis): from the last checkpoint
            step = self.resume_step()
            self.event(f"transferqueue restarted without its table: restarting the job from "
                       f"step {step}")
            self._stop_workers(lambda n: n != "transferqueue")
            self._start_job(resume=True)
        elif name.startswith("trainer-"):
            self._stop_workers(lambda n: n.startswith("trainer-"))
            for n in [n for n in self._pending if n.startswith("trainer-")]:
                del self._pending[n]
            self.start_gang(resume=True)
            self.event(f"trainer gang restarted from step {self.resume_step()}")
        else:
            self._spawn(name, self._args[name])
            self.event(f"{name} restarted")

    def _stop_workers(self, which, timeout: float = 10.0) -> None:
        victims = [p for n, p in self.procs.items() if which(n) and p.poll() is None]
        for p in victims:
            _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in victims:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(p, signal.SIGKILL)
                p.wait()
        for n in [n for n in self._pending if which(n)]:
            del self._pending[n]

    def run_to_end(self, poll: float = 0.2) -> None:
        """Start, supervise until the job is done (or fails), stop: a run without a view."""
        self.start()
        try:
            while not self.supervise():
                time.sleep(poll)
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop every worker: the trainer first (it checkpoints what it trained), then
        the others; then the transferqueue."""
        self._stop_workers(lambda n: n.startswith("trainer-"), timeout=60.0)
        self._stop_workers(lambda n: n != "transferqueue")
        self._stop_workers(lambda n: True)
        if self._forks is not None:
            self._forks.close()
            self._forks = None

    def purge_storage(self) -> None:
        """Delete this job's keys from its Redis units (a table nobody will read)."""
        if not self.redis:
            return
        from .transferqueue.storage.redis_unit import RedisUnit
        from .transferqueue.units import redis_user

        for url in self.redis:
            unit = RedisUnit(url, job=self.job_name,
                             password=os.environ.get(PASSWORD_ENV) or None,
                             username=redis_user())
            try:
                unit.purge()
            finally:
                unit.close()

    def metrics(self) -> list[dict]:
        return read_metrics(self.run_dir)


def _signal(proc: subprocess.Popen | Forked, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def read_metrics(run_dir: Path) -> list[dict]:
    """The per-step lines of RUN_DIR/metrics.jsonl (none yet: []).

    A trainer gang that restarted from a checkpoint trains the steps after it
    again: the last line of a step is the one its weights came from. A last line
    without its newline is still being written (a live view reads while the trainer
    appends): it is left for the next read."""
    path = RunDir(run_dir).metrics
    if not path.exists():
        return []
    by_step: dict[int, dict] = {}
    for line in path.read_text().split("\n")[:-1]:
        if line.strip():
            m = json.loads(line)
            by_step[m["step"]] = m
    return [by_step[s] for s in sorted(by_step)]


def _job_name(run_dir: Path) -> str:
    """The run's job name (its job.yaml), else the directory's name."""
    import yaml

    try:
        return yaml.safe_load(RunDir(run_dir).job_file.read_text())["metadata"]["name"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return run_dir.name


def write_plots(run_dir: Path) -> dict:
    """reward.png and timeline.png of a finished (or stopped) run; returns a summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .infra.timeline import bubble_ratio, load_spans, plot_gantt

    from .progress import smoothed
    from .infra.timeline import run_panels

    name = _job_name(run_dir)
    metrics = read_metrics(run_dir)
    summary: dict = {"steps": len(metrics)}
    if metrics:
        steps = [m["step"] for m in metrics]
        rewards = [m["reward_mean"] for m in metrics]
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot(steps, rewards, color="tab:blue", alpha=0.35, lw=1, label="mean reward")
        ax.plot(steps, smoothed(rewards), color="tab:blue", lw=2,
                label="smoothed (EMA 0.1)")
        ax.axhline(rewards[0], color="gray", ls="--", lw=1,
                   label=f"step 1 (after warm-up): {rewards[0]:.3f}")
        ax.set_title(f"{name}: mean reward per step")
        ax.set_xlabel("step")
        ax.set_ylabel("mean reward")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        fig.savefig(RunDir(run_dir).reward_plot, dpi=110)
        plt.close(fig)
        summary["reward_first"] = metrics[0]["reward_mean"]
        summary["reward_last"] = metrics[-1]["reward_mean"]
    spans = [s for s in load_spans(run_dir) if s.step >= 0]
    if spans:
        ratio = bubble_ratio(spans)
        summary["bubble_ratio"] = ratio
        panels = run_panels(spans, name, ratio)
        summary["timeline_panels"] = [t for t, _ in panels]
        plot_gantt(panels, RunDir(run_dir).timeline_plot)
    return summary
