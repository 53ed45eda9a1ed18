"""The README's cluster journey on a real node, nothing faked: the images built by
`python -m images.build` and imported into the node's containerd, `helm install` of
the chart (the operator runs as a pod from its image, with its ServiceAccount), then
`kubectl apply` of examples/k8s/quickstart-cluster-pvc.yaml and
examples/quickstart-cluster.yaml. The Redis, TransferQueue, rollout and trainer pods
become Ready, `kubectl get rljobs` shows STEP advancing with real STALENESS and
TOKENS/S, the job succeeds, its final weights are on the checkpoint volume, and
`ttlSecondsAfterFinished` removes its children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from images import oci
from tests.cluster.controlplane import REPO
from tests.cluster.operator_harness import CHART, OPERATOR_NS, RELEASE, helm

pytestmark = pytest.mark.node

JOB = "quickstart-cluster"


@pytest.fixture(scope="module")
def images_on_node(node_cluster):
    """The CPU runtime and operator images, built (cached by content) and imported."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "images.build", "runtime", "operator"],
                         cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-4000:]
    built = time.monotonic() - t0
    refs = {}
    for line in out.stdout.splitlines():
        ref, archive = line.split()
        t1 = time.monotonic()
        oci.import_archive(archive, node_cluster.socket)
        refs[ref] = time.monotonic() - t1
    print(f"\nimages: build {built:.0f}s (cached by content), import "
          + ", ".join(f"{r} {s:.0f}s" for r, s in refs.items()))
    return refs


def _rljob(plane, ns: str) -> dict:
    out = plane.kubectl("get", "rljob", JOB, "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def _condition(job: dict, kind: str) -> str:
    for c in job.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return c["status"]
    return ""


def _children(plane, ns: str) -> list[str]:
    out = plane.kubectl("get", "pods,services,statefulsets,deployments,configmaps,secrets",
                        "-n", ns, "-l", f"rljob.dev/name={JOB}", "-o", "name", check=False)
    return out.stdout.split()


def _debug(plane, ns: str) -> str:
    pods = plane.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout
    events = plane.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp",
                           check=False).stdout[-4000:]
    logs = plane.kubectl("logs", "-n", OPERATOR_NS, f"deploy/{RELEASE}", "--tail=40",
                         check=False).stdout
    return f"pods:\n{pods}\nevents:\n{events}\noperator:\n{logs}"


@pytest.mark.timeout(1800)
def test_readme_journey_runs_the_job_on_a_real_node(node_cluster, images_on_node, tmp_path):
    plane = node_cluster.plane
    # the checkpoint volume: a PersistentVolume on the node, bound to the example's claim
    # (clusters provision one from their default StorageClass)
    ns = f"e2e-{os.getpid()}"
    plane.kubectl("create", "namespace", ns)
    host_dir = tmp_path / "checkpoints"
    host_dir.mkdir()
    host_dir.chmod(0o777)  # the job's pods run as uid 1000
    plane.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": f"{ns}-checkpoints"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "hostPath": {"path": str(host_dir), "type": "Directory"},
                 "claimRef": {"namespace": ns, "name": "quickstart-checkpoints"}}}))
    try:
        t0 = time.monotonic()
        helm(plane, "install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace",
             "--set", "reconcileInterval=2", "--set", "logFormat=plain")
        plane.kubectl("-n", OPERATOR_NS, "rollout", "status", f"deploy/{RELEASE}",
                      "--timeout=180s", timeout=200)
        operator_ready = time.monotonic() - t0

        t0 = time.monotonic()
        plane.kubectl("apply", "-n", ns, "-f", str(REPO / "examples/k8s/quickstart-cluster-pvc.yaml"))
        plane.kubectl("apply", "-n", ns, "-f", str(REPO / "examples/quickstart-cluster.yaml"))
        ready_at = None
        steps_seen: list[tuple[float, int, float, float]] = []
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            job = _rljob(plane, ns)
            progress = job.get("status", {}).get("progress", {})
            if ready_at is None and _condition(job, "Ready") == "True":
                ready_at = time.monotonic() - t0
            step = progress.get("step", 0)
            if step and (not steps_seen or steps_seen[-1][1] != step):
                steps_seen.append((time.monotonic() - t0, step,
                                   progress.get("stalenessMean", 0.0),
                                   progress.get("tokensPerSecond", 0.0)))
            if _condition(job, "Succeeded") == "True":
                break
            if _condition(job, "Failed") == "True":
                pytest.fail(f"the job failed: {job['status']}\n{_debug(plane, ns)}")
            time.sleep(1)
        else:
            pytest.fail(f"no success in 900 s: {steps_seen[-3:]}\n{_debug(plane, ns)}")
        succeeded = time.monotonic() - t0
        table = plane.kubectl("get", "rljobs", "-n", ns).stdout
        print(f"\noperator Ready {operator_ready:.0f}s after helm install; apply -> Ready "
              f"{ready_at}s, -> Succeeded {succeeded:.0f}s; steps seen "
              f"{[s[1] for s in steps_seen]}\n{table}")
        assert ready_at is not None, "the job never showed Ready=True"
        assert len(steps_seen) >= 3 and steps_seen[-1][1] == 60, steps_seen
        # async with maxStaleness 1: real staleness in (0, 1], real generated tokens/s
        assert any(0 < s[2] <= 1 for s in steps_seen), steps_seen
        assert all(s[2] <= 1 for s in steps_seen), steps_seen
        assert any(s[3] > 0 for s in steps_seen), steps_seen
        header, row = table.splitlines()[:2]
        assert header.split()[:5] == ["NAME", "READY", "STEP", "STALENESS", "TOKENS/S"]
        assert row.split()[0] == JOB and row.split()[2] == "60"
        final = host_dir / JOB / "final"
        assert (final / "config.json").exists(), sorted(str(p) for p in host_dir.rglob("*"))
        assert any(final.glob("*.safetensors"))

        # ttlSecondsAfterFinished: 30 -> the children go, the RLJob stays
        t1 = time.monotonic()
        deadline = time.monotonic() + 120
        while _children(plane, ns) and time.monotonic() < deadline:
            time.sleep(1)
        assert not _children(plane, ns), _children(plane, ns)
        print(f"children removed {time.monotonic() - t1:.0f}s after success")
        assert _rljob(plane, ns), "the RLJob itself stays"
    finally:
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        helm(plane, "uninstall", RELEASE, "-n", OPERATOR_NS, check=False)
        plane.kubectl("delete", "pv", f"{ns}-checkpoints", "--wait=false", check=False)
