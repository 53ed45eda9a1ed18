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
    APIService is unavailable), ElasticJobsViaWorkloadSlices on (alpha at v0.17,
    off by default: the elastic RLJobs' rollout counts, operator/rljob_operator/
    slices.py), leader election off (one replica);
  - the visibility APIServices are left out for the same reason.
`uninstall` removes it all again: Kueue's webhooks answer for every pod and
Deployment of the cluster while they are registered.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from tests.cluster.controlplane import ControlPlane, free_port

NAMESPACE = "kueue-system"
DEPLOYMENT = "kueue-controller-manager"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
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
                                      "VisibilityOnDemand": False,
                                      "ElasticJobsViaWorkloadSlices": True}
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
    wait_for_webhooks(plane, timeout)
    return time.monotonic() - t0


def wait_for_webhooks(plane: ControlPlane, timeout: float) -> None:
    """Until Kueue admits objects through its webhooks (its certificates made and
    served)."""
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
            on_host = (plane.workdir / "kueue.log").exists()
            raise AssertionError(f"Kueue's webhooks do not answer: {done.stderr}\n"
                                 + (plane.log_tail("kueue", 40) if on_host else debug(plane)))
        time.sleep(2)


def run_on_host(plane: ControlPlane, host_ip: str, fair_sharing: bool = True,
                timeout: float = 180) -> float:
    """Kueue's manager as a process on this machine (the scale bench's nodes are
    simulated: no pod runs), its release manifests applied but its Deployment, the
    webhook Service's endpoints this machine's address (the apiserver reaches webhooks
    through endpoints with --enable-aggregator-routing); with `fair_sharing`, fair
    sharing between the ClusterQueues of a cohort. Returns the seconds it took."""
    t0 = time.monotonic()
    docs = [d for d in render(plane, "none") if d["kind"] != "Deployment"]
    config = {}
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kueue-manager-config":
            config = yaml.safe_load(d["data"]["controller_manager_config.yaml"])
        if d["kind"] == "Service" and d["metadata"]["name"] == WEBHOOK_SERVICE:
            d["spec"].pop("selector", None)
            port = d["spec"]["ports"][0]
    docs.append({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{WEBHOOK_SERVICE}-host", "namespace": NAMESPACE,
                     "labels": {"kubernetes.io/service-name": WEBHOOK_SERVICE,
                                "endpointslice.kubernetes.io/managed-by": "rljob-tests"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host_ip], "conditions": {"ready": True}}],
        "ports": [{"name": port.get("name", ""), "port": port["targetPort"],
                   "protocol": "TCP"}]})
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                  input="\n---\n".join(json.dumps(d) for d in docs), timeout=180)
    config["webhook"] = {"port": port["targetPort"], "host": host_ip,
                         "certDir": str(plane.workdir / "kueue-certs")}
    config["metrics"] = {"bindAddress": f"127.0.0.1:{free_port()}"}
    config["health"] = {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"}
    if fair_sharing:
        config["fairSharing"] = {"preemptionStrategies": ["LessThanOrEqualToFinalShare",
                                                          "LessThanInitialShare"]}
    path = plane.workdir / "kueue-config.yaml"
    path.write_text(yaml.safe_dump(config))
    plane.spawn("kueue", [str(plane.bin_dir / "kueue"), f"--config={path}",
                          f"--kubeconfig={plane.kubeconfig}", "--zap-log-level=1"])
    _mount_certificates(plane, Path(config["webhook"]["certDir"]), timeout)
    wait_for_webhooks(plane, timeout)
    return time.monotonic() - t0


def _mount_certificates(plane: ControlPlane, cert_dir: Path, timeout: float) -> None:
    """What the kubelet does for the manager's pod: its webhook certificates (the
    Secret its certificate rotation writes) as files in its certificate folder."""
    import base64

    deadline = time.monotonic() + timeout
    while True:
        data = plane.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{WEBHOOK_SECRET}"
                         ).get("data") or {}
        if data.get("tls.crt") and data.get("tls.key"):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"Kueue made no webhook certificate:\n"
                                 f"{plane.log_tail('kueue', 40)}")
        time.sleep(0.5)
    cert_dir.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        (cert_dir / key).write_bytes(base64.b64decode(value))


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
           cpu: str, node_labels: dict[str, str], preemption: bool = True,
           memory: str = "64Gi") -> None:
    """A ResourceFlavor with `node_labels`, a ClusterQueue with `cpu` and `memory` of
    it (every resource the pods request must be covered) and a LocalQueue of it in
    `namespace`; with `preemption`, a higher priority preempts a lower one in the
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
                          {"name": "memory", "nominalQuota": memory}]}]}]}},
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
