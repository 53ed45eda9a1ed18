"""A NetworkPolicy enforcer on the test node: SIG Network's kube-network-policies
(tests/gotools/netpol, built by build.sh with one patch: its queue verdict goes
through the xtables NFQUEUE target, since the test machines' kernel is built without
nft's queue expression; the policy logic is its own), run as its install manifest runs it (a
privileged pod on the host network with a service account that reads pods,
namespaces and NetworkPolicies). It puts an nftables table, `inet
kube-network-policies`, in front of the pods: each new connection to or from a pod
goes to a netfilter queue, and the enforcer's verdict follows the policies that
select the pods. Traffic the node's root user sends (the kubelet's probes, the tests'
own process) is let through, as the enforcer does on every node.

`Enforcer.start()` imports the image, applies the manifests and waits until the
table is there; `stop()` deletes the pod (the enforcer removes its table as it
exits) and removes the table itself if the enforcer could not. It runs with
`--fail-open`: while nobody answers the queue (the enforcer starting or gone), the
node's traffic passes rather than every pod of the shared node going dark."""

from __future__ import annotations

import json
import os
import subprocess
import time

TABLE = ("inet", "kube-network-policies")
NAME, NAMESPACE = "kube-network-policies", "kube-system"


def table_present() -> bool:
    return subprocess.run(["nft", "list", "table", *TABLE], capture_output=True,
                          timeout=30).returncode == 0


def remove_table() -> None:
    if table_present():
        subprocess.run(["nft", "delete", "table", *TABLE], capture_output=True, timeout=30)


def manifests(image: str, node: str) -> list[dict]:
    meta = {"name": NAME, "namespace": NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": NAME},
         "rules": [
             {"apiGroups": [""], "resources": ["pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
              "verbs": ["list", "watch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": NAME},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": NAME},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {**meta, "labels": {"app": NAME}},
         "spec": {
             "serviceAccountName": NAME,
             "hostNetwork": True,
             "nodeName": node,
             "terminationGracePeriodSeconds": 10,
             "containers": [{
                 "name": NAME,
                 "image": image,
                 "imagePullPolicy": "Never",
                 "args": [f"--hostname-override={node}", "--disable-nri", "--fail-open",
                          "--nfqueue-id=98", "--metrics-bind-address=127.0.0.1:0", "--v=2"],
                 "securityContext": {"privileged": True,
                                     "capabilities": {"add": ["NET_ADMIN"]}},
                 "resources": {"requests": {"cpu": "50m", "memory": "50Mi"}},
             }],
         }},
    ]


class Enforcer:
    def __init__(self, node):
        self.node = node
        self.plane = node.plane

    def start(self, timeout: float = 120) -> Enforcer:
        if os.geteuid() != 0:
            raise RuntimeError("the enforcer's nftables table needs root")
        remove_table()  # a run killed before its stop left it
        image = self.node.import_binary_image(NAME)
        self.plane.kubectl("apply", "-f", "-", input="\n---\n".join(
            json.dumps(m) for m in manifests(image, self.node.name)))
        deadline = time.monotonic() + timeout
        while not table_present():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the enforcer put no nftables table in {timeout:.0f}s:\n"
                                   + self.logs())
            time.sleep(0.5)
        time.sleep(2)  # its informers list the pods and policies
        return self

    def logs(self) -> str:
        return self.plane.kubectl("logs", "-n", NAMESPACE, NAME, "--tail=40",
                                  check=False).stdout

    def stop(self) -> None:
        self.plane.kubectl("delete", "pod", "-n", NAMESPACE, NAME, "--grace-period=10",
                           "--wait=true", "--timeout=60s", check=False, timeout=90)
        remove_table()
