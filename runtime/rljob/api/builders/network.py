"""The job's NetworkPolicy: who may open a connection to the job's pods.

Every pod of the job admits connections from the job's own pods on any port (the
trainer gang's and the collective weight groups' connections use ports their
libraries choose), the operator's pods to the TransferQueue controller's port (it
reads the job's progress there), and the monitoring namespaces the operator's chart
names to the metrics ports; nobody else. Egress stays open. Only a cluster whose
network plugin enforces NetworkPolicies applies it; behind it the job's credentials
still refuse a stranger (infra/auth.py, the Redis units' ACL user).
"""

from __future__ import annotations

from dataclasses import dataclass

from rljob.api import RLJob
from rljob.contract import DRIVER_METRICS_PORT, LABEL_NAME, METRICS_PORT, TQ_PORT

from .common import _meta

# the label every namespace carries with its own name (Kubernetes sets it)
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
# the operator's pods, as its chart labels them
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "rljob-operator"}


@dataclass(frozen=True)
class NetworkAccess:
    """Who outside a job may reach it (the operator's settings, from its chart)."""

    enabled: bool = True  # render the policy at all
    # the operator's namespace (None: an operator outside the cluster, which reaches
    # the job from a node, as the kubelet's probes do)
    operator_namespace: str | None = "rljob-system"
    monitoring_namespaces: tuple[str, ...] = ("monitoring",)


def network_policy_name(job: str) -> str:
    return f"{job}-ingress"


def _tcp(*ports: int) -> list[dict]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def build_network_policy(job: RLJob, access: NetworkAccess) -> dict:
    name = job.metadata.name
    own = {"podSelector": {"matchLabels": {LABEL_NAME: name}}}
    ingress: list[dict] = [{"from": [own]}]
    if access.operator_namespace:
        ingress.append({"from": [{
            "namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: access.operator_namespace}},
            "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
        }], "ports": _tcp(TQ_PORT)})
    if access.monitoring_namespaces:
        ingress.append({"from": [{"namespaceSelector": {"matchExpressions": [{
            "key": NAMESPACE_LABEL, "operator": "In",
            "values": list(access.monitoring_namespaces)}]}}],
            "ports": _tcp(METRICS_PORT, DRIVER_METRICS_PORT)})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _meta(job, network_policy_name(name), "network"),
        "spec": {"podSelector": {"matchLabels": {LABEL_NAME: name}},
                 "policyTypes": ["Ingress"], "ingress": ingress},
    }
