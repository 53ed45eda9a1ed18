"""Operator figures on the real control plane (prints, asserts nothing):

  apply → children latency: `kubectl apply` of an RLJob until every child the
  operator creates exists (median and p90 of N applies, one after another);
  the operator's RSS with M RLJobs reconciled (each with its children).

    .venv/bin/python -m tests.cluster.bench_operator [--applies 20] [--jobs 50]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import yaml
from kubernetes import client, config

from rljob.api import RLJob
from rljob.api import builders as b
from tests.cluster.controlplane import REPO, ControlPlane, gotools_bin
from tests.cluster.operator_harness import (
    CHART, OPERATOR_NS, RELEASE, OperatorProcess, helm, service_account_kubeconfig, wait_for)

NS = "bench"


def child_names(api: client.ApiClient, name: str) -> set[tuple[str, str]]:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    sel = f"{b.LABEL_NAME}={name}"
    out: set[tuple[str, str]] = set()
    for kind, items in (
        ("Pod", core.list_namespaced_pod(NS, label_selector=sel).items),
        ("Service", core.list_namespaced_service(NS, label_selector=sel).items),
        ("ConfigMap", core.list_namespaced_config_map(NS, label_selector=sel).items),
        ("Secret", core.list_namespaced_secret(NS, label_selector=sel).items),
        ("StatefulSet", apps.list_namespaced_stateful_set(NS, label_selector=sel).items),
        ("Deployment", apps.list_namespaced_deployment(NS, label_selector=sel).items),
    ):
        for i in items:
            if kind == "Pod" and i.metadata.labels.get(b.LABEL_ROLE) in ("transferqueue", "storage"):
                continue
            out.add((kind, i.metadata.name))
    return out


def main() -> None:
    # the test control plane serves a self-signed certificate
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    ap = argparse.ArgumentParser()
    ap.add_argument("--applies", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--interval", type=float, default=5.0, help="operator reconcile interval")
    args = ap.parse_args()

    base = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    plane = ControlPlane(gotools_bin(), with_controller_manager=True).start()
    op = None
    try:
        plane.kubectl("apply", "-f", str(REPO / "crds"))
        plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/rljobs.rljob.dev")
        helm(plane, "install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace")
        plane.kubectl("create", "namespace", NS)
        tmp = Path(tempfile.mkdtemp(prefix="rljob-bench-op-"))
        op = OperatorProcess(service_account_kubeconfig(plane, tmp / "kubeconfig"),
                             tmp / "operator.log", interval=args.interval).start()
        config.load_kube_config(str(plane.kubeconfig))
        api = client.ApiClient()
        rss_idle = op.rss_bytes()

        def apply(i: int) -> float:
            doc = copy.deepcopy(base)
            doc["metadata"]["name"] = f"bench-{i}"
            job = RLJob.model_validate(doc)
            job.metadata.namespace = NS
            want = {(o["kind"], o["metadata"]["name"]) for o in b.build_all(job, "x")}
            text = yaml.safe_dump(doc)
            t0 = time.perf_counter()
            subprocess.run([str(plane.bin_dir / "kubectl"), "-n", NS, "apply", "-f", "-"],
                           input=text, text=True, check=True, capture_output=True,
                           env=plane.env())
            wait_for(lambda: child_names(api, doc["metadata"]["name"]) == want, 60, 0.02,
                     f"children of bench-{i}")
            return time.perf_counter() - t0

        latencies = [apply(i) for i in range(args.applies)]
        for i in range(args.applies, args.jobs):
            apply(i)
        # let every job go through a few timer reconciles before measuring
        time.sleep(3 * args.interval)
        rss = op.rss_bytes()
        lat = sorted(latencies)
        print(f"apply → all children present, {len(lat)} RLJobs applied one after another "
              f"(kubectl apply included):")
        print(f"  median {statistics.median(lat) * 1000:.0f} ms, p90 "
              f"{lat[int(0.9 * (len(lat) - 1))] * 1000:.0f} ms, min {lat[0] * 1000:.0f} ms, "
              f"max {lat[-1] * 1000:.0f} ms")
        print(f"operator RSS: {rss_idle / 2**20:.0f} MiB with no RLJob, {rss / 2**20:.0f} MiB "
              f"with {args.jobs} RLJobs (reconcile interval {args.interval:g}s)")
    finally:
        if op is not None:
            op.stop()
        plane.stop()


if __name__ == "__main__":
    main()
