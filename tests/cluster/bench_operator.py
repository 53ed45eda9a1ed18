"""The operator at a platform's scale (prints figures, asserts nothing; the cluster
tier runs it small in test_scale.py and asserts what holds at any size).

The real kube-apiserver, etcd, controller-manager and scheduler, Kueue's manager
(its release manifests, fair sharing between two ClusterQueues of one cohort), the
operator (`rljob-operator` as the chart's ServiceAccount) and kwok's simulated
nodes, each with 8 NPUs as the Ascend device plugin advertises them. RLJobs of
mixed sizes (gangs of 1-8 trainer ranks, 1-16 rollout replicas) are queued into the
two ClusterQueues; high-priority jobs then reclaim borrowed quota (preemptions), and
some jobs finish (their rank 0 marked Succeeded), so queued ones start.

    .venv/bin/python -m tests.cluster.bench_operator --nodes 1000 --jobs 100

Prints: apply → every pod of the job present, for the jobs admitted as they came,
and admission → every pod present, for the jobs never evicted; the operator's reconcile time and its
wait for a worker (p50, p99) and its work queue's depth; the operator's API requests
per running job-minute by verb and resource (from the apiserver's audit log, the
operator's ServiceAccount alone) in a steady window; its CPU and peak memory;
etcd's object count.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from rljob.contract import LABEL_NAME, LABEL_ROLE
from rljob_operator import queue
from tests.cluster import kueue
from tests.cluster.controlplane import REPO, ControlPlane, gotools_bin, host_ip
from tests.cluster.kwok import NPU, Kwok
from tests.cluster.operator_harness import (
    CHART, OPERATOR_NS, RELEASE, OperatorProcess, helm, service_account_kubeconfig, wait_for)

TEAMS = ("team-a", "team-b")
COHORT = "platform"
FLAVOR = "ascend-910b"
EXAMPLE = REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml"
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:{OPERATOR_NS}"]
- level: None
"""


def job_doc(i: int, rng: random.Random, team: str, priority: str | None) -> dict:
    """RLJob i: the Ascend example with a gang of 1-8 trainer ranks (8 NPUs each)
    and 1-16 rollout replicas of 1-4 NPUs, queued in `team`'s LocalQueue."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    spec.pop("scheduling")  # Kueue gangs it here
    spec["model"].pop("pvc")
    spec["dataset"].pop("pvc")
    ranks = rng.choice((1, 1, 2, 2, 4, 8))
    replicas = rng.randint(1, 16)
    npus = rng.choice((1, 2, 4))
    spec["trainer"]["numNodes"] = ranks
    spec["rollout"].update(replicas=replicas, minReplicas=replicas, maxReplicas=replicas,
                           npusPerReplica=npus, tensorParallel=npus)
    spec["rollout"]["autoscaling"]["enabled"] = False
    labels = {queue.QUEUE_LABEL: team}
    if priority:
        labels[queue.PRIORITY_LABEL] = priority
    doc["metadata"] = {"name": f"job-{i}", "namespace": team, "labels": labels}
    return doc


def pods_of(doc: dict) -> int:
    """The pods a running job has: its trainer ranks, rollout replicas, storage units
    and TransferQueue controller."""
    s = doc["spec"]
    return (s["trainer"]["numNodes"] + s["rollout"]["replicas"]
            + s["transferQueue"].get("storageUnits", 1) + 1)


def npus_of(doc: dict) -> int:
    s = doc["spec"]
    return (s["trainer"]["numNodes"] * s["trainer"]["npusPerNode"]
            + s["rollout"]["replicas"] * s["rollout"]["npusPerReplica"])


def queue_objects(npus_per_queue: int) -> list[dict]:
    """A flavor of the simulated nodes, two ClusterQueues of one cohort (each may
    borrow what the other leaves, and reclaim it; a higher priority preempts within),
    a LocalQueue of each in its namespace, and a high WorkloadPriorityClass."""
    objs: list[dict] = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": FLAVOR}, "spec": {"nodeLabels": {"type": "kwok"}}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
         "metadata": {"name": "high"}, "value": 1000},
    ]
    for team in TEAMS:
        objs += [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
             "metadata": {"name": team},
             "spec": {"cohortName": COHORT, "namespaceSelector": {},
                      "preemption": {"withinClusterQueue": "LowerPriority",
                                     "reclaimWithinCohort": "Any"},
                      "resourceGroups": [{
                          "coveredResources": ["cpu", "memory", NPU],
                          "flavors": [{"name": FLAVOR, "resources": [
                              {"name": "cpu", "nominalQuota": "100k"},
                              {"name": "memory", "nominalQuota": "1000Ti"},
                              {"name": NPU, "nominalQuota": str(npus_per_queue)}]}]}]}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
             "metadata": {"name": team, "namespace": team}, "spec": {"clusterQueue": team}},
        ]
    return objs


@dataclass
class Watch:
    """What the bench saw of each job, polled every second (times are wall-clock
    seconds; an admission's is its Workload's Admitted condition's, to the second)."""

    applied: dict[str, float] = field(default_factory=dict)  # job -> apply time
    admitted: dict[str, float] = field(default_factory=dict)  # its first admission
    complete: dict[str, float] = field(default_factory=dict)  # all its pods seen
    phase: str = "apply"  # the bench's phase now
    admitted_in: dict[str, str] = field(default_factory=dict)  # job -> phase it was in
    evicted: set[str] = field(default_factory=set)
    want: dict[str, int] = field(default_factory=dict)  # job -> pods it runs
    depth: list[float] = field(default_factory=list)  # the operator's work queue
    now_admitted: set[str] = field(default_factory=set)  # as of the last poll
    now_pods: Counter = field(default_factory=Counter)  # job -> its pods, last poll
    ended: set[str] = field(default_factory=set)  # jobs the bench finished

    def running(self) -> list[str]:
        """The jobs admitted, with every pod, at the last poll."""
        return [j for j in sorted(self.now_admitted) if self.now_pods[j] == self.want[j]]

    def poll(self, plane: ControlPlane, op: OperatorProcess) -> None:
        now = time.time()
        pods = Counter()
        # the jobs' pods' metadata, from the API server's cache (resourceVersion 0):
        # the bench's poll must not load the control plane it measures, as a quorum
        # read of every whole pod of the cluster each second does
        for p in plane.get("/api/v1/pods", metadata_only=True, labelSelector=LABEL_NAME,
                           resourceVersion="0").get("items") or []:  # null when none
            job = (p["metadata"].get("labels") or {}).get(LABEL_NAME)
            if job and not p["metadata"].get("deletionTimestamp"):
                pods[f"{p['metadata']['namespace']}/{job}"] += 1
        wls = plane.get("/apis/kueue.x-k8s.io/v1beta2/workloads",
                        resourceVersion="0").get("items") or []
        self.now_admitted, self.now_pods = set(), pods
        for wl in wls:
            owner = (wl["metadata"].get("ownerReferences") or [{}])[0].get("name")
            job = f"{wl['metadata']['namespace']}/{owner}"
            conds = {c["type"]: c for c in (wl.get("status") or {}).get("conditions") or []}
            admitted = conds.get("Admitted", {})
            if admitted.get("status") == "True":
                self.now_admitted.add(job)
                if job not in self.admitted:
                    self.admitted[job] = _epoch(admitted["lastTransitionTime"])
                    self.admitted_in[job] = self.phase
            # Kueue counts every eviction (a poll may fall between an eviction and
            # the admission after it)
            evictions = ((wl.get("status") or {}).get("schedulingStats") or {}).get(
                "evictions") or []
            if (conds.get("Evicted", {}).get("status") == "True"
                    or sum(e.get("count", 0) for e in evictions)):
                self.evicted.add(job)
        for job, n in self.want.items():
            if pods[job] == n and job in self.admitted and job not in self.complete:
                self.complete[job] = now
        self.depth.append(metric(op.metrics(), "rljob_operator_work_queue_depth"))


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus text (0 where absent)."""
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def buckets_of(text: str, name: str, where: str = "") -> Counter:
    """A Prometheus histogram's cumulative buckets (its label sets that hold `where`,
    added up): upper bound -> count."""
    buckets: Counter = Counter()
    for m in re.finditer(rf'^{re.escape(name)}_bucket{{([^}}]*)}} (\S+)$', text, re.M):
        labels = m.group(1)
        if where in labels:
            le = re.search(r'le="([^"]+)"', labels).group(1)
            buckets[float(le)] += float(m.group(2))
    return buckets


def quantile(text: str, name: str, q: float, where: str = "", since: str = "") -> float:
    """The q-quantile of a Prometheus histogram (its label sets that hold `where`,
    together; what it counted after the text `since`, if given), read off its
    cumulative buckets as histogram_quantile does (linear in a bucket)."""
    buckets = buckets_of(text, name, where)
    buckets.subtract(buckets_of(since, name, where))
    if not buckets or buckets[float("inf")] == 0:
        return 0.0
    rank, lower, below = q * buckets[float("inf")], 0.0, 0.0
    for bound in sorted(buckets):
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(buckets[bound] - below, 1e-9)
        lower, below = bound, buckets[bound]
    return lower


def audit_counts(path: Path, since: float, until: float
                 ) -> tuple[Counter, Counter, dict[tuple[str, str], list[float]]]:
    """The operator's requests between two wall-clock times, by (verb, resource); its
    pod creations (201s) by namespace/pod name, and each request's seconds in the API
    server (received to answered) by (verb, resource), over the whole log."""
    by_kind: Counter = Counter()
    creates: Counter = Counter()
    latency: dict[tuple[str, str], list[float]] = {}
    for line in path.read_text().splitlines():
        e = json.loads(line)
        ref = e.get("objectRef") or {}
        resource = ref.get("resource", "?") + (f"/{ref['subresource']}"
                                               if ref.get("subresource") else "")
        if (e["verb"] == "create" and resource == "pods"
                and (e.get("responseStatus") or {}).get("code") == 201):
            creates[f"{ref.get('namespace')}/{ref.get('name')}"] += 1
        t = _epoch(e["stageTimestamp"])
        if e["verb"] != "watch":  # a watch is answered for as long as it lasts
            latency.setdefault((e["verb"], resource), []).append(
                t - _epoch(e["requestReceivedTimestamp"]))
        if since <= t <= until:
            by_kind[(e["verb"], resource)] += 1
    return by_kind, creates, latency


def cpu_of(plane: ControlPlane, op: OperatorProcess) -> Counter:
    """CPU seconds so far of each process of the cluster (by program), the operator's
    and the bench's own (with its kubectl children)."""
    import resource

    out: Counter = Counter()
    for proc in [*plane.procs, op.proc]:
        name = "operator" if proc is op.proc else Path(proc.args[0]).name
        try:
            out[name] += proc_figures(proc.pid)[0]
        except (FileNotFoundError, ProcessLookupError):
            pass
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # kubectl's, and ended ones'
    out["bench"] = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    return out


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def proc_figures(pid: int) -> tuple[float, int]:
    """A process's CPU seconds so far and its peak resident memory (bytes)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    hwm = next(int(line.split()[1]) * 1024 for line in
               Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    return cpu, hwm


@dataclass
class Result:
    nodes: int
    jobs: int
    watch: Watch
    steady: tuple[float, int]  # (seconds of the steady window, jobs running in it)
    requests: Counter  # the operator's (verb, resource) in the steady window
    creates: Counter  # namespace/pod -> the operator's creations of it (201)
    metrics: str  # the operator's /metrics at the end
    steady_metrics: tuple[str, str]  # ... at the steady window's start and end
    steady_cpu: float  # the operator's CPU seconds in the steady window
    cpu_seconds: float  # over the whole run
    peak_rss: int
    objects: float  # apiserver_storage_objects, summed
    seconds: float  # the whole run
    finished: list[str] = field(default_factory=list)
    # the operator's requests' seconds in the API server, by (verb, resource)
    latency: dict = field(default_factory=dict)
    # from the first apply to the end: (seconds, CPU seconds by process)
    cpu: tuple[float, Counter] = field(default_factory=lambda: (0.0, Counter()))
    preempting: list[str] = field(default_factory=list)
    admitted_after_finish: int = 0  # jobs first admitted after others finished
    final_admitted: set[str] = field(default_factory=set)
    final_pods: Counter = field(default_factory=Counter)


def job_of_pod(pod: str) -> str:
    """namespace/job of a pod's namespace/name (<job>-trainer-0, <job>-rollout-3, ...)."""
    ns, name = pod.split("/")
    for role in ("-trainer-", "-rollout-", "-redis-", "-tq-"):
        if role in name:
            return f"{ns}/{name.split(role)[0]}"
    return f"{ns}/{name}"


def start(nodes: int, interval: float, workdir: Path) -> tuple[ControlPlane, OperatorProcess]:
    """The control plane with kwok's nodes, Kueue and the operator, all started."""
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    plane = ControlPlane(gotools_bin(), with_controller_manager=True, with_scheduler=True,
                         apiserver_args=(
                             "--enable-aggregator-routing=true",  # webhooks on this host
                             f"--audit-policy-file={policy}",
                             f"--audit-log-path={workdir / 'audit.log'}",
                             "--audit-log-format=json")).start()
    try:
        kwok = Kwok(plane).start()
        kwok.add_nodes(nodes)
        wait_for(lambda: kwok.ready_nodes() == nodes, 300, 1, f"{nodes} kwok nodes Ready")
        kueue.run_on_host(plane, host_ip())
        plane.kubectl("apply", "-f", str(REPO / "crds"))
        plane.wait_established("rljobs.rljob.dev")
        # the chart's RBAC and ServiceAccount; its Deployment at no replica (the
        # operator runs here, as that ServiceAccount, for its figures)
        helm(plane, "install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace",
             "--set", "replicaCount=0")
        op = OperatorProcess(service_account_kubeconfig(plane, workdir / "kubeconfig"),
                             workdir / "operator.log", interval=interval).start()
    except BaseException:
        plane.stop()
        raise
    return plane, op


def apply(plane: ControlPlane, docs: list[dict], watch: Watch) -> None:
    for doc in docs:
        key = f"{doc['metadata']['namespace']}/{doc['metadata']['name']}"
        watch.want[key] = pods_of(doc)
        watch.applied[key] = time.time()
        plane.kubectl("apply", "-f", "-", input=json.dumps(doc))


def settle(plane: ControlPlane, op: OperatorProcess, watch: Watch, seconds: float) -> None:
    """Polls until every admitted job has its pods and nothing changed for a while, or
    `seconds` pass."""
    deadline, quiet_since, last = time.monotonic() + seconds, time.monotonic(), None
    while time.monotonic() < deadline:
        watch.poll(plane, op)
        state = (len(watch.admitted), len(watch.complete), len(watch.evicted),
                 sum(watch.now_pods.values()), len(watch.now_admitted))
        if state != last:
            last, quiet_since = state, time.monotonic()
        elif (time.monotonic() - quiet_since > 3 * op.interval
              and all(watch.now_pods[j] == watch.want[j]
                      for j in watch.now_admitted - watch.ended)):
            return
        time.sleep(1)


def finish(plane: ControlPlane, jobs: list[str]) -> None:
    """What a trainer's rank 0 does at its last step: its pod Succeeded (kwok runs no
    container, so the bench says so)."""
    for key in jobs:
        ns, name = key.split("/")
        pods = plane.get(f"/api/v1/namespaces/{ns}/pods",
                         labelSelector=f"{LABEL_NAME}={name},{LABEL_ROLE}=trainer"
                         ).get("items", [])
        rank0 = min(pods, key=lambda p: p["metadata"]["name"])
        plane.kubectl("-n", ns, "patch", "pod", rank0["metadata"]["name"],
                      "--subresource=status", "--type=merge",
                      "-p", json.dumps({"status": {"phase": "Succeeded"}}))


def run(nodes: int, jobs: int, steady: float = 120, interval: float = 5.0,
        seed: int = 0) -> Result:
    """The whole bench; every process it started is stopped at the end."""
    t0 = time.monotonic()
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="rljob-bench-op-"))
    plane, op = start(nodes, interval, workdir)
    try:
        # quotas: together, about 60 % of what the jobs ask at first; team-a asks
        # for more than its share, borrowing what team-b leaves
        low = [job_doc(i, rng, TEAMS[0] if i % 3 else TEAMS[1], None)
               for i in range(jobs - jobs // 5)]
        high = [job_doc(i, rng, TEAMS[1], "high") for i in range(len(low), jobs)]
        demand = sum(npus_of(d) for d in low)
        plane.kubectl("apply", "-f", "-", input="\n---\n".join(
            json.dumps(o) for o in queue_objects(max(8, int(0.3 * demand)))))
        watch = Watch()
        cpu_start, t_apply = cpu_of(plane, op), time.monotonic()
        apply(plane, low, watch)
        settle(plane, op, watch, 600)
        # steady: every admitted job running, nothing changing
        cpu0, _ = proc_figures(op.proc.pid)
        since, metrics0 = time.time(), op.metrics()
        end = time.monotonic() + steady
        while time.monotonic() < end:
            watch.poll(plane, op)
            time.sleep(1)
        until, metrics1 = time.time(), op.metrics()
        cpu1, _ = proc_figures(op.proc.pid)
        running = len(watch.running())
        # team-b's high-priority jobs reclaim its quota (preempting what team-a
        # borrowed), then a quarter of the running jobs finish
        watch.phase = "preempt"
        apply(plane, high, watch)
        settle(plane, op, watch, 600)
        running_now = watch.running()
        done = running_now[: max(1, len(running_now) // 4)]
        before = set(watch.now_admitted)
        watch.phase = "finish"
        watch.ended = set(done)
        finish(plane, done)
        settle(plane, op, watch, 600)
        cpu2, peak = proc_figures(op.proc.pid)
        requests, creates, latency = audit_counts(workdir / "audit.log", since, until)
        cpu = cpu_of(plane, op)
        cpu.subtract(cpu_start)
        objects = metric(plane_metrics(plane), "apiserver_storage_objects")
        return Result(nodes, jobs, watch, (until - since, running), requests, creates,
                      op.metrics(), (metrics0, metrics1), cpu1 - cpu0, cpu2, peak, objects, time.monotonic() - t0,
                      finished=done, preempting=[
                          f"{d['metadata']['namespace']}/{d['metadata']['name']}"
                          for d in high],
                      admitted_after_finish=len(watch.now_admitted - before),
                      final_admitted=watch.now_admitted - set(done),
                      final_pods=watch.now_pods, latency=latency,
                      cpu=(time.monotonic() - t_apply, cpu))
    finally:
        op.stop()
        plane.stop()
        if not os.environ.get("RLJOB_KEEP_CLUSTER_DIR"):
            shutil.rmtree(workdir, ignore_errors=True)


def plane_metrics(plane: ControlPlane) -> str:
    """The API server's /metrics (Prometheus text)."""
    return (plane.read("/metrics") or b"").decode()


def ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    v = sorted(values)
    return f"{v[min(len(v) - 1, int(q * len(v)))] * 1000:.0f}"


def report(r: Result) -> None:
    w = r.watch
    # admitted as they came (quota free), and every admission (the seconds Kueue
    # took left out)
    at_once = [w.complete[j] - w.applied[j] for j in w.complete
               if w.admitted_in.get(j) == "apply" and j not in w.evicted]
    later = [w.complete[j] - w.admitted[j] for j in w.complete if j not in w.evicted]
    window, running = r.steady
    job_minutes = running * window / 60
    total = sum(r.requests.values())
    print(f"{r.jobs} RLJobs on {r.nodes} simulated nodes ({r.nodes * 8} NPUs), "
          f"{len(w.admitted)} admitted, {len(w.evicted)} evicted, {len(r.finished)} "
          f"finished; the run took {r.seconds:.0f} s")
    print(f"apply -> every pod present, {len(at_once)} jobs admitted as they came: "
          f"p50 {ms(at_once, 0.5)} ms, p99 {ms(at_once, 0.99)} ms")
    print(f"admission -> every pod present, {len(later)} jobs never evicted (admission "
          f"times to the second): p50 {ms(later, 0.5)} ms, p99 {ms(later, 0.99)} ms")
    for name, what in (("rljob_operator_reconcile_seconds", "reconcile"),
                       ("rljob_operator_worker_wait_seconds", "wait for a worker")):
        print(f"{what}: p50 {quantile(r.metrics, name, 0.5) * 1000:.0f} ms, p99 "
              f"{quantile(r.metrics, name, 0.99) * 1000:.0f} ms "
              f"({metric(r.metrics, name + '_count'):.0f} of them)")
    by = []
    for trigger in ("create", "resume", "update", "timer", "workload"):
        where = f'trigger="{trigger}"'
        n = metric(r.metrics, f"rljob_operator_reconcile_seconds_count{{{where}}}")
        p99 = quantile(r.metrics, "rljob_operator_reconcile_seconds", 0.99, where)
        if n:
            by.append(f"{trigger} {p99 * 1000:.0f} ms ({n:.0f})")
    print("  p99 by trigger: " + ", ".join(by))
    start, end = r.steady_metrics
    print(f"  in the steady window: reconcile p50 "
          f"{quantile(end, 'rljob_operator_reconcile_seconds', 0.5, since=start) * 1000:.0f}"
          f" ms, p99 "
          f"{quantile(end, 'rljob_operator_reconcile_seconds', 0.99, since=start) * 1000:.0f}"
          f" ms; wait for a worker p99 "
          f"{quantile(end, 'rljob_operator_worker_wait_seconds', 0.99, since=start) * 1000:.0f}"
          f" ms")
    print(f"work queue depth: mean {statistics.fmean(w.depth or [0]):.2f}, "
          f"max {max(w.depth or [0]):.0f}; reconcile errors "
          f"{metric(r.metrics, 'rljob_operator_errors_total'):.0f}")
    print(f"API requests of the operator, steady {window:.0f} s with {running} jobs "
          f"running ({len(w.applied) - len(r.preempting)} applied): "
          f"{total / max(job_minutes, 1e-9):.1f} per running job-minute")
    for (verb, resource), n in r.requests.most_common():
        print(f"  {verb:>6} {resource:<32} {n / max(job_minutes, 1e-9):6.2f}")
    print(f"operator CPU: {r.steady_cpu / window * 100:.1f} % of a core steady, "
          f"{r.cpu_seconds:.0f} s over the run; peak RSS {r.peak_rss / 2**20:.0f} MiB")
    print(f"etcd objects (apiserver_storage_objects): {r.objects:.0f}")
    print("the operator's requests' time in the API server over the run (p50 / p99 ms, "
          "count):")
    for key, values in sorted(r.latency.items(), key=lambda kv: -len(kv[1]))[:8]:
        print(f"  {key[0]:>6} {key[1]:<32} {ms(values, 0.5):>6} / {ms(values, 0.99):>6} "
              f"({len(values)})")
    seconds, cpu = r.cpu
    print(f"CPU from the first apply to the end ({seconds:.0f} s, "
          f"{os.cpu_count()} cores), cores used on average by each process: "
          + ", ".join(f"{name} {s / max(seconds, 1e-9):.2f}"
                      for name, s in cpu.most_common()))


def main() -> None:
    # the test control plane serves a self-signed certificate
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--steady", type=float, default=120, help="seconds of steady state")
    ap.add_argument("--interval", type=float, default=5.0, help="operator reconcile interval")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    report(run(args.nodes, args.jobs, args.steady, args.interval, args.seed))


if __name__ == "__main__":
    main()
