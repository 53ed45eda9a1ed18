"""Several operator replicas with kopf peering, as the chart installs them
(`peering.enabled`, `replicaCount` > 1) on a real kube-apiserver: the chart brings
kopf's peering CRDs only then, each replica runs under the chart's ServiceAccount,
the peering object is created by the operator itself, one replica reconciles and,
when it stops, the standby takes over."""

from __future__ import annotations

import pytest

from tests.cluster.controlplane import REPO
from tests.cluster.operator_harness import (
    CHART, OperatorProcess, get_json, helm, service_account_kubeconfig, wait_for)

RELEASE = "peer"
ACCOUNT = "peer-rljob-operator"  # the chart's fullname for this release


def _peers(cluster, ns: str) -> dict:
    out = cluster.kubectl("-n", ns, "get", "kopfpeerings.kopf.dev", "rljob-operator",
                          "-o", "json", check=False)
    if out.returncode != 0:
        return {}
    import json

    return json.loads(out.stdout).get("status") or {}


def _trainer_uid(cluster, ns: str) -> str | None:
    out = cluster.kubectl("-n", ns, "get", "pod", "quickstart-trainer-0", "-o",
                          "jsonpath={.metadata.uid}", check=False)
    return out.stdout.strip() or None if out.returncode == 0 else None


@pytest.mark.timeout(600)
def test_standby_replica_takes_over_through_the_peering_object(crd_installed, tmp_path):
    cluster = crd_installed
    plain = helm(cluster, "template", RELEASE, str(CHART), "--kube-version", "v1.34.4").stdout
    assert "kopf.dev" not in plain  # no peering CRDs without peering
    with cluster.namespace("peer-ops") as ops, cluster.namespace("peer-jobs") as jobs:
        helm(cluster, "install", RELEASE, str(CHART), "-n", ops, "--set", "scope=namespace",
             "--set", f"watchNamespaces={{{jobs}}}", "--set", "peering.enabled=true",
             "--set", "replicaCount=2")
        replicas: list[OperatorProcess] = []
        try:
            cluster.wait_established("kopfpeerings.kopf.dev")
            kubeconfig = service_account_kubeconfig(cluster, tmp_path / "kubeconfig", ops, ACCOUNT)
            for priority in (2, 1):  # the first is the active one
                replicas.append(OperatorProcess(
                    kubeconfig, tmp_path / f"operator-{priority}.log",
                    args=("--peering", "rljob-operator", "--priority", str(priority),
                          "-n", jobs)).start())
            wait_for(lambda: len(_peers(cluster, jobs)) == 2, 60,
                     what="both replicas in the peering object")
            assert sorted(p["priority"] for p in _peers(cluster, jobs).values()) == [1, 2]
            assert "created peering object" in replicas[0].log_tail(200)

            cluster.kubectl("-n", jobs, "apply", "-f", str(REPO / "examples/quickstart.yaml"))
            first = wait_for(lambda: _trainer_uid(cluster, jobs), 60,
                             what="the active replica creating the job's pods")
            # the handler logs once it has also written the status, after the pods
            wait_for(lambda: "Creation is processed" in replicas[0].log_tail(400), 60,
                     what="the active replica's creation handler")
            assert "is processed" not in replicas[1].log_tail(400)  # on standby

            replicas[0].stop()  # the active one goes: the standby reconciles now
            cluster.kubectl("-n", jobs, "delete", "pod", "quickstart-trainer-0", "--wait=false")
            wait_for(lambda: (_trainer_uid(cluster, jobs) or first) != first, 120,
                     what="the standby recreating the deleted trainer pod")
            wait_for(lambda: "Resuming operations" in replicas[1].log_tail(400), 30,
                     what="the standby saying it took over")
            assert get_json(cluster, "-n", jobs, "get", "rljob", "quickstart")["status"]
        finally:
            for r in replicas:
                r.stop()
            cluster.kubectl("-n", jobs, "delete", "rljob", "--all", "--wait=false", check=False)
            helm(cluster, "uninstall", RELEASE, "-n", ops, check=False)
    # the peering CRDs leave with the release
    wait_for(lambda: cluster.kubectl("get", "crd", "kopfpeerings.kopf.dev",
                                     check=False).returncode != 0, 60,
             what="the peering CRDs deleted with the release")
