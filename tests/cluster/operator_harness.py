"""Run the operator against the test control plane as a user's cluster would:
installed by Helm, running under the chart's ServiceAccount (so the chart's
RBAC is what it gets), and a real gRPC server playing a job's TransferQueue
controller for the progress/autoscaler path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent import futures
from pathlib import Path

import grpc

from rljob.transferqueue.proto import transferqueue_pb2 as pb
from rljob.transferqueue.proto import transferqueue_pb2_grpc as pbg
from tests.cluster.controlplane import REPO, ControlPlane, free_port, stop_process

RELEASE = "rljob-operator"
OPERATOR_NS = "rljob-system"
CHART = REPO / "charts" / "rljob-operator"


def wait_for(fn, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def helm(cluster: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(cluster.bin_dir / "helm"), *args], capture_output=True, text=True,
                          env=cluster.env(), timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def service_account_kubeconfig(cluster: ControlPlane, path: Path, namespace: str = OPERATOR_NS,
                               account: str = RELEASE) -> Path:
    """A kubeconfig holding a token of the chart's ServiceAccount, trusting the
    apiserver's CA (the test CA, or the one its self-signed certificate's file holds)."""
    token = cluster.kubectl("-n", namespace, "create", "token", account,
                            "--duration=3h").stdout.strip()
    ca = cluster.ca_file if cluster.for_node else cluster.workdir / "certs" / "apiserver.crt"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {{server: {cluster.server}, certificate-authority: {ca}}}
users:
- name: operator
  user: {{token: {token}}}
contexts:
- name: test
  context: {{cluster: test, user: operator}}
current-context: test
""")
    return path


class OperatorProcess:
    """`rljob-operator` as a subprocess (what the chart's Deployment runs)."""

    def __init__(self, kubeconfig: Path, log_path: Path, interval: float = 1.0,
                 args: tuple[str, ...] = ()):
        self.kubeconfig = kubeconfig
        # these control planes have no node: no job would ever fit (capacity.py; its
        # test runs on the node, tests/cluster/test_e2e.py)
        self.args = ("--no-capacity-check", *args)
        self.log_path = log_path
        self.interval = interval
        self.proc: subprocess.Popen | None = None
        self.liveness_port = self.metrics_port = 0

    def start(self, timeout: float = 60) -> OperatorProcess:
        self.liveness_port, self.metrics_port = free_port(), free_port()
        env = dict(os.environ)  # outside a cluster: the kubeconfig is named on the command line
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env.pop("KUBECONFIG", None)
        exe = Path(sys.executable).with_name("rljob-operator")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(exe), "--kubeconfig", str(self.kubeconfig), "--interval", str(self.interval),
             "--liveness-port",
             str(self.liveness_port), "--metrics-port", str(self.metrics_port),
             "--log-format", "plain", *self.args],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_for(self.healthy, timeout, 0.2, "operator /healthz")
        return self

    def healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz",
                                        timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=2) as r:
            return r.read().decode()

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=20)
        self.proc = None


class ScriptedStats(pbg.TransferQueueControllerServicer):
    """A real gRPC server answering Stats with metrics the test sets step by step."""

    def __init__(self):
        self._lock = threading.Lock()
        self._metrics = pb.JobMetrics()
        self._consumers: list[pb.ConsumerStats] = []
        self.calls = 0
        self.port = free_port()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pbg.add_TransferQueueControllerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(self, step: int, gen: float, train: float, tokens: float = 1000.0,
            staleness: float = 0.5, consumers: dict[str, int] | None = None) -> None:
        with self._lock:
            self._metrics = pb.JobMetrics(step=step, gen_seconds=gen, train_seconds=train,
                                          staleness_mean=staleness, staleness_max=1,
                                          tokens_per_second=tokens, samples_per_second=2.0,
                                          reward_mean=0.25, timestamp=time.time(),
                                          source="trainer-0")
            self._consumers = [pb.ConsumerStats(task="rollout", consumer=k, claimed=v)
                               for k, v in (consumers or {}).items()]

    def Stats(self, request, context):
        with self._lock:
            self.calls += 1
            return pb.StatsResponse(metrics=self._metrics, consumers=self._consumers)

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop(0)


def get_json(cluster: ControlPlane, *args: str) -> dict:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def children(cluster: ControlPlane, ns: str, job: str) -> set[tuple[str, str]]:
    """(kind, name) of every object labelled as this job's child."""
    kinds = ("pods,services,statefulsets.apps,deployments.apps,configmaps,secrets,"
             "networkpolicies.networking.k8s.io")
    items = get_json(cluster, "-n", ns, "get", kinds, "-l", f"rljob.dev/name={job}")["items"]
    # pods of the Deployment/StatefulSet belong to those, not to the job directly
    return {(i["kind"], i["metadata"]["name"]) for i in items
            if not (i["kind"] == "Pod" and i["metadata"].get("labels", {}).get(
                "rljob.dev/role") in ("transferqueue", "storage"))}


def mark_ready(cluster: ControlPlane, ns: str, pod: str, ready: bool = True,
               phase: str = "Running") -> None:
    status = {"status": {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}
    cluster.kubectl("-n", ns, "patch", "pod", pod, "--subresource=status", "--type=merge",
                    "-p", json.dumps(status))
