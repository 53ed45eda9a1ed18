"""A real Kueue on the test node, installed as a platform team installs it: its
release manifests (config/default of the pinned tag, rendered by `kubectl
kustomize`) applied server-side, its manager running as a pod from an image packed
from the binary tests/gotools/build.sh built, its webhooks served with the
certificates it makes itself (internal certificate management).

What differs from the release manifests, and why:
  - the manager's image: rljob.local/kueue:test, imported into the node
    (imagePullPolicy Never), and requests a 2-core node can give beside the jobs;
  - its configuration: `integrations.frameworks` only batch/job and
    `externalFrameworks` RLJob.v1alpha1.rljob.dev (the kind whose Workloads the
    RLJob operator creates), VisibilityOnDemand off (its APIService would need the
    aggregation layer's proxy client certificates; kubectl's discovery fails while an
    APIService is unavailable), leader election off (one replica);
  - the visibility APIServices are left out for the same reason.
`uninstall` removes it all again: Kueue's webhooks answer for every pod and
Deployment of the cluster while they are registered.
"""

from __future__ import annotations

import json
import time

import yaml

from tests.cluster.controlplane import ControlPlane

NAMESPACE = "kueue-system"
DEPLOYMENT = "kueue-controller-manager"
RLJOB_FRAMEWORK = "RLJob.v1alpha1.rljob.dev"


def render(plane: ControlPlane, image: str) -> list[dict]:
    """config/default of the built tag, with the changes the module docstring lists."""
    out = plane.kubectl("kustomize", str(plane.bin_dir / "kueue-config" / "default"),
                        timeout=120)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kept = []
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind == "APIService":
            continue
        if kind == "Deployment" and name == DEPLOYMENT:
            pod = d["spec"]["template"]["spec"]
            [manager] = [c for c in pod["containers"] if c["name"] == "manager"]
            manager.update(image=image, imagePullPolicy="Never",
                           resources={"requests": {"cpu": "50m", "memory": "128Mi"},
                                      "limits": {"cpu": "1", "memory": "512Mi"}})
        if kind == "ConfigMap" and name == "kueue-manager-config":
            config = yaml.safe_load(d["data"]["controller_manager_config.yaml"])
            config["integrations"] = {"frameworks": ["batch/job"],
                                      "externalFrameworks": [RLJOB_FRAMEWORK]}
            config["featureGates"] = {**config.get("featureGates", {}),
                                      "VisibilityOnDemand": False}
            config["leaderElection"] = {"leaderElect": False}
            d["data"]["controller_manager_config.yaml"] = yaml.safe_dump(config)
        kept.append(d)
    return kept


def install(plane: ControlPlane, image: str, timeout: float = 300) -> float:
    """Applies the manifests and waits until Kueue admits objects through its webhooks
    (its certificates made and served); returns the seconds it took."""
    t0 = time.monotonic()
    docs = render(plane, image)
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                  input="\n---\n".join(json.dumps(d) for d in docs), timeout=180)
    out = plane.kubectl("-n", NAMESPACE, "rollout", "status", f"deploy/{DEPLOYMENT}",
                        f"--timeout={int(timeout)}s", timeout=timeout + 20, check=False)
    if out.returncode != 0:
        raise AssertionError(f"Kueue's manager is not Ready: {out.stderr}\n{debug(plane)}")
    # the webhooks answer once the manager serves the certificates it made: a dry-run
    # of a ResourceFlavor goes through its defaulting and validating webhooks
    probe = json.dumps({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                        "metadata": {"name": "rljob-webhook-probe"}})
    deadline = time.monotonic() + timeout
    while True:
        done = plane.kubectl("apply", "--dry-run=server", "-f", "-", input=probe,
                             check=False)
        if done.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"Kueue's webhooks do not answer: {done.stderr}\n"
                                 f"{debug(plane)}")
        time.sleep(2)
    return time.monotonic() - t0


def uninstall(plane: ControlPlane, image: str) -> None:
    """Everything `install` applied, webhooks first (they would refuse what follows)."""
    docs = render(plane, image)
    order = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    for kinds in (order, None):
        for d in docs:
            if (kinds is None) != (d["kind"] in order):
                plane.kubectl("delete", d["kind"], d["metadata"]["name"],
                              *(["-n", d["metadata"]["namespace"]]
                                if d["metadata"].get("namespace") else []),
                              "--ignore-not-found", "--wait=false", check=False)


def queues(plane: ControlPlane, namespace: str, cluster_queue: str, local_queue: str,
           cpu: str, node_labels: dict[str, str], preemption: bool = True) -> None:
    """A ResourceFlavor with `node_labels`, a ClusterQueue with `cpu` of it (memory
    plenty: every resource the pods request must be covered) and a LocalQueue of it
    in `namespace`; with `preemption`, a higher priority preempts a lower one in the
    ClusterQueue."""
    flavor = f"{cluster_queue}-flavor"
    objs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": flavor}, "spec": {"nodeLabels": node_labels}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": cluster_queue},
         "spec": {"namespaceSelector": {},
                  "preemption": {"withinClusterQueue": "LowerPriority" if preemption
                                 else "Never"},
                  "resourceGroups": [{
                      "coveredResources": ["cpu", "memory"],
                      "flavors": [{"name": flavor, "resources": [
                          {"name": "cpu", "nominalQuota": cpu},
                          {"name": "memory", "nominalQuota": "64Gi"}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": local_queue, "namespace": namespace},
         "spec": {"clusterQueue": cluster_queue}},
    ]
    plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objs))


def priority_class(plane: ControlPlane, name: str, value: int) -> None:
    plane.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
        "metadata": {"name": name}, "value": value}))


def debug(plane: ControlPlane) -> str:
    pods = plane.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False).stdout
    logs = plane.kubectl("logs", "-n", NAMESPACE, f"deploy/{DEPLOYMENT}", "--tail=60",
                         check=False).stdout
    events = plane.kubectl("get", "events", "-n", NAMESPACE, check=False).stdout[-2000:]
    return f"kueue pods:\n{pods}\nevents:\n{events}\nmanager log:\n{logs}"
