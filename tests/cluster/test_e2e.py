"""The cluster guide's journey on a real node, nothing faked, walked command by
command from docs/guides/cluster.md (tests/cluster/guide.py): the images built by
`python -m images.build` and pushed with `python -m images.push` to a real registry,
`helm install` of the chart with the values it printed (the operator runs as a pod
from the registry's image, with its ServiceAccount), then `kubectl apply` of
examples/k8s/quickstart-cluster-pvc.yaml and examples/quickstart-cluster.yaml (its
image lines set to the registry's copy, its 60 steps cut to 16). The Redis,
TransferQueue, rollout and trainer pods become Ready, `kubectl get rljobs` shows STEP
advancing with real STALENESS and TOKENS/S, the job succeeds, its final weights are on
the checkpoint volume, and `ttlSecondsAfterFinished` removes its children."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.cluster import guide
from tests.cluster.controlplane import REPO
from tests.cluster.operator_harness import CHART, OPERATOR_NS, RELEASE, helm, wait_for

pytestmark = pytest.mark.node

JOB = "quickstart-cluster"
# the cluster guide's sections this module walks (tests/cluster/guide.py)
IMAGES = "Get the images into your registry"
INSTALL = "Install the operator and run the quickstart"


@pytest.fixture(scope="module")
def images_on_node(node_cluster, bin_dir, tmp_path_factory):
    """The CPU runtime and operator images, built (cached by content) and pushed to a
    real registry with `python -m images.push`, as the cluster guide does; the node
    trusts the registry's CA and pulls from it. The operator's image is taken off the
    node first, so `helm install` makes the node pull it whole from the registry; the
    runtime image is pulled from the registry and named also by its plain name, for the
    tests that apply the examples as they are (a pull fetches only the layers the node
    lacks: after a change to rljob's code, its own layer)."""
    from tests.cluster.registry import Registry

    # the guide's command line: `sudo python -m images.build ... | python -m images.push
    # REGISTRY` (root here already)
    build, push = guide.command(IMAGES, "sudo python -m images.build").split(" | ")
    build_argv = guide.argv(build, {})
    assert build_argv[:2] == ["sudo", "python"], build_argv
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, *build_argv[2:]],
                         cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-4000:]
    built = time.monotonic() - t0
    archives = [line.split() for line in out.stdout.splitlines()]
    # the node's copies of the operator image go (helm install pulls it), and the
    # names earlier runs' registries gave (each its own port): they would keep old
    # versions' layers in the node's image store; with them the ids (`sha256:...`)
    # the kubelet named their pulls by, which hold the same content
    for ref in _stale_images(node_cluster.image_targets()):
        node_cluster.remove_image(ref)
    runtime = [(ref, a) for ref, a in archives if "/rljob/runtime" in ref]
    todo = [(ref, a) for ref, a in runtime if not node_cluster.has_image(Path(a))]
    _room_for(node_cluster, todo, archives)
    refs = {ref: "held" for ref, _ in runtime}
    registry = Registry(bin_dir, tmp_path_factory.mktemp("registry")).start()
    try:
        t1 = time.monotonic()
        pinned = registry.push(out.stdout, command=guide.argv(
            push, {guide.REGISTRY: f"{registry.host}/rljob"}))
        pushed = time.monotonic() - t1
        registry.trust_on(node_cluster)
        for ref, archive in todo:
            t2 = time.monotonic()
            node_cluster.pull_image(pinned[ref], [ref])
            assert node_cluster.has_image(Path(archive)), ref  # the archive's manifest
            refs[ref] = f"{time.monotonic() - t2:.0f}s"
        print(f"\nimages: build {built:.0f}s (cached by content), push {pushed:.0f}s "
              f"({', '.join(pinned.values())}), pulled to the node "
              + ", ".join(f"{r} {s}" for r, s in refs.items()))
        yield {"registry": registry, "pinned": pinned}
    finally:
        registry.stop()


def _stale_images(targets: dict[str, str]) -> list[str]:
    """Of the node's image names (name → target digest), those of the operator image
    and of earlier runs' registries, and the ids of their targets that no other name
    holds (pure)."""
    stale = {ref for ref in targets
             if "/rljob/operator" in ref or re.match(r"127\.0\.0\.1:\d+/rljob/", ref)}
    kept = {d for ref, d in targets.items() if ref not in stale and not ref.startswith("sha256:")}
    held = {targets[ref] for ref in stale} - kept
    return sorted(stale | {ref for ref, d in targets.items()
                           if ref.startswith("sha256:") and d in held})


def _room_for(node_cluster, todo, pushed) -> None:
    """A pull into a nearly full disk ends in the kubelet's disk-pressure eviction,
    which deletes images (the pod sandbox's too) and every pod fails: say so first
    (room for the pulls, and for the registry's copy of the images pushed)."""
    disk = shutil.disk_usage(node_cluster.workdir)
    need = (sum(2.2 * Path(a).stat().st_size for _, a in todo)
            + sum(Path(a).stat().st_size for _, a in pushed) + 0.01 * disk.total + 2**31)
    if disk.free < need:
        pytest.fail(f"{disk.free / 2**30:.1f} GiB free on the disk of {node_cluster.workdir}; "
                    f"pushing and pulling the images needs about {need / 2**30:.1f} GiB "
                    "(content, unpacked layers, the registry's copy, and the kubelet evicts "
                    "below 1 % free): free some "
                    "space (old ~/.cache/rljob entries, /tmp) and run again")


def _pinned(images_on_node, name: str) -> str:
    """The pushed image `name` (runtime, operator) by its registry name and digest."""
    return next(p for s, p in images_on_node["pinned"].items() if f"/rljob/{name}:" in s)


def _rljob(plane, ns: str, job: str = JOB) -> dict:
    return plane.get(f"/apis/rljob.dev/v1alpha1/namespaces/{ns}/rljobs/{job}")


def _pods(plane, ns: str, selector: str) -> list[dict]:
    return plane.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=selector).get("items", [])


def _condition(job: dict, kind: str) -> str:
    for c in job.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return c["status"]
    return ""


def _children(plane, ns: str, job: str = JOB) -> list[str]:
    out = plane.kubectl("get", "pods,services,statefulsets,deployments,configmaps,secrets,"
                        "networkpolicies",
                        "-n", ns, "-l", f"rljob.dev/name={job}", "-o", "name", check=False)
    return out.stdout.split()


def _debug(plane, ns: str) -> str:
    pods = plane.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout
    events = plane.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp",
                           check=False).stdout[-4000:]
    logs = plane.kubectl("logs", "-n", OPERATOR_NS, f"deploy/{RELEASE}", "--tail=40",
                         check=False).stdout
    failed = ""  # the last lines of each container that ended in an error
    for pod in plane.get(f"/api/v1/namespaces/{ns}/pods").get("items", []):
        for c in pod.get("status", {}).get("containerStatuses", []):
            ended = c.get("state", {}).get("terminated") or c.get("lastState", {}).get(
                "terminated")
            if ended and ended.get("exitCode"):
                out = plane.kubectl("logs", "-n", ns, pod["metadata"]["name"], "-c", c["name"],
                                    "--tail=15", *(["--previous"] if "terminated" not in
                                                   c.get("state", {}) else []), check=False)
                failed += f"{pod['metadata']['name']}/{c['name']}:\n{out.stdout[-2000:]}\n"
    return f"pods:\n{pods}\nevents:\n{events}\noperator:\n{logs}\nfailed containers:\n{failed}"


@pytest.fixture(scope="module")
def operator_release(node_cluster, images_on_node):
    """`helm install` of the chart with the pushed operator image, by digest, as the
    cluster guide installs it: the node pulls it from the registry and runs it."""
    plane = node_cluster.plane
    registry = images_on_node["registry"]
    repository, digest = _pinned(images_on_node, "operator").split("@")
    # the guide's `helm install`, the values images.push printed in its placeholders'
    # places; the tests' own settings after it
    line = guide.argv(guide.command(INSTALL, "helm install"), {
        f"{guide.REGISTRY}/operator": repository, "sha256:d690...": digest,
        "charts/rljob-operator": str(CHART)})
    assert line[:3] == ["helm", "install", RELEASE] and line[3] == str(CHART), line
    assert line[line.index("-n") + 1] == OPERATOR_NS, line
    t0 = time.monotonic()
    helm(plane, *line[1:], "--set", "reconcileInterval=2", "--set", "logFormat=plain")
    try:
        out = plane.kubectl("-n", OPERATOR_NS, "rollout", "status", f"deploy/{RELEASE}",
                            "--timeout=180s", timeout=200, check=False)
        assert out.returncode == 0, f"the operator is not Ready: {out.stderr}\n" + _debug(
            plane, OPERATOR_NS) + plane.kubectl("-n", OPERATOR_NS, "describe", "pods",
                                                check=False).stdout[-3000:]
        print(f"\noperator Ready {time.monotonic() - t0:.0f}s after helm install, its "
              f"image pulled from the registry: {registry.served('blobs')} layers and "
              "configs sent")
        pod = _pods(plane, OPERATOR_NS, "app.kubernetes.io/name=rljob-operator")[0]
        assert pod["spec"]["containers"][0]["image"] == f"{repository}@{digest}"
        # the node fetched the operator's manifest and blobs from the registry
        assert registry.served("manifests", repository.split("/", 1)[1]) >= 1, \
            registry.log_tail()
        assert registry.served("blobs", repository.split("/", 1)[1]) >= 2, registry.log_tail()
        yield plane
    finally:
        helm(plane, "uninstall", RELEASE, "-n", OPERATOR_NS, check=False)


@pytest.fixture
def namespace(node_cluster, tmp_path):
    """A namespace for one test, and a directory on the node for its volumes."""
    plane = node_cluster.plane
    ns = f"e2e-{os.getpid()}-{tmp_path.name[-12:].lower().strip('_-')}".replace("_", "-")[:63]
    plane.kubectl("create", "namespace", ns)
    pvs: list[str] = []

    def volume(claim: str) -> Path:
        """A PersistentVolume on the node, pre-bound to `claim` (clusters provision
        one from their default StorageClass)."""
        host_dir = tmp_path / claim
        host_dir.mkdir()
        host_dir.chmod(0o777)  # the job's pods run as non-root users
        pv = f"{ns}-{claim}"[:253]
        plane.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "hostPath": {"path": str(host_dir), "type": "Directory"},
                     "claimRef": {"namespace": ns, "name": claim}}}))
        pvs.append(pv)
        return host_dir

    try:
        yield ns, volume
    finally:
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for pv in pvs:
            plane.kubectl("delete", "pv", pv, "--wait=false", check=False)


class Watch:
    """Polls an RLJob once a second: the steps it shows (time, step, progress) and
    its end. `on_poll(job)` runs at every poll (a test's faults)."""

    def __init__(self, plane, ns: str, job: str):
        self.plane, self.ns, self.job = plane, ns, job
        self.t0 = time.monotonic()
        self.steps: list[tuple[float, int, dict]] = []
        self.ready_at: float | None = None

    def until_succeeded(self, timeout: float, on_poll=None, stall: float = 300) -> float:
        """Seconds from the start to Succeeded; fails on Failed, on `timeout`, and when
        no new step shows for `stall` seconds after the first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.steps and time.monotonic() - self.t0 - self.steps[-1][0] > stall:
                pytest.fail(f"no new step for {stall:.0f} s after step {self.step()}\n"
                            f"{_debug(self.plane, self.ns)}")
            job = self.poll()
            if _condition(job, "Succeeded") == "True":
                return time.monotonic() - self.t0
            if _condition(job, "Failed") == "True":
                pytest.fail(f"the job failed: {job['status']}\n{_debug(self.plane, self.ns)}")
            if on_poll is not None:
                on_poll(job)
            time.sleep(1)
        pytest.fail(f"no success in {timeout:.0f} s: {[s[:2] for s in self.steps[-3:]]}\n"
                    f"{_debug(self.plane, self.ns)}")

    def poll(self) -> dict:
        """The job now, its Ready time and a step it shows for the first time noted."""
        job = _rljob(self.plane, self.ns, self.job)
        progress = job.get("status", {}).get("progress", {})
        if self.ready_at is None and _condition(job, "Ready") == "True":
            self.ready_at = time.monotonic() - self.t0
        step = progress.get("step", 0)
        if step and (not self.steps or self.steps[-1][1] != step):
            self.steps.append((time.monotonic() - self.t0, step, progress))
        return job

    def step(self) -> int:
        return self.steps[-1][1] if self.steps else 0

    def rate(self, t_from: float, t_to: float) -> float:
        """Steps a second the job showed between two times (seconds since the start)."""
        inside = [(t, s) for t, s, _ in self.steps if t_from <= t <= t_to]
        if len(inside) < 2:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def _apply(plane, ns: str, doc_or_path) -> None:
    if isinstance(doc_or_path, Path):
        plane.kubectl("apply", "-n", ns, "-f", str(doc_or_path))
    else:
        plane.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(doc_or_path))


@pytest.mark.timeout(1800)
def test_readme_journey_runs_the_job_on_a_real_node(operator_release, namespace,
                                                   images_on_node):
    """The cluster guide's route: the images pushed to the registry, the chart
    installed with the operator's (operator_release), the job applied naming the
    runtime image's registry copy by digest; it trains, shows its progress, ends and
    is cleaned up."""
    plane = operator_release
    runtime = _pinned(images_on_node, "runtime")
    ns, volume = namespace
    host_dir = volume("quickstart-checkpoints")
    # the guide's next commands: the claim, then the job with its two image lines set
    # to the registry's copy; `kubectl get rljobs -w` is the Watch
    claim, job, get = (guide.argv(c, {"examples/": f"{REPO}/examples/"})
                       for c in guide.commands(INSTALL)[1:])
    assert claim[:3] == job[:3] == ["kubectl", "apply", "-f"] and get[:3] == [
        "kubectl", "get", "rljobs"], (claim, job, get)
    plane.kubectl(*claim[1:], "-n", ns)
    watch = Watch(plane, ns, JOB)
    # the example as the README applies it, but for its length: 60 steps and a
    # 200-step warm-up show the learning; the checks below need a few steps shown, real
    # staleness and tokens/s, the final weights and the clean-up (at 60 steps the test
    # took 9 of the cluster tier's 50 minutes); 20 warm-up steps as in the chaos tier
    doc = yaml.safe_load(Path(job[3]).read_text())
    assert doc["spec"]["algorithm"]["maxSteps"] == 60
    steps = doc["spec"]["algorithm"]["maxSteps"] = 16
    doc["spec"]["model"]["warmupSteps"] = 20
    doc["spec"]["image"] = doc["spec"]["transferQueue"]["redis"]["image"] = runtime
    _apply(plane, ns, doc)
    succeeded = watch.until_succeeded(900)
    # every pod of the job ran the registry's image
    assert {c["image"] for pod in _pods(plane, ns, f"rljob.dev/name={JOB}")
            for c in pod["spec"]["containers"]} == {runtime}
    steps_seen = [(t, s, p.get("stalenessMean", 0.0), p.get("tokensPerSecond", 0.0))
                  for t, s, p in watch.steps]
    table = plane.kubectl("get", "rljobs", "-n", ns).stdout
    print(f"\napply -> Ready {watch.ready_at}s, -> Succeeded {succeeded:.0f}s; steps seen "
          f"{[s[1] for s in steps_seen]}\n{table}")
    assert watch.ready_at is not None, "the job never showed Ready=True"
    assert len(steps_seen) >= 3 and steps_seen[-1][1] == steps, steps_seen
    # async with maxStaleness 1: real staleness in (0, 1], real generated tokens/s
    assert any(0 < s[2] <= 1 for s in steps_seen), steps_seen
    assert all(s[2] <= 1 for s in steps_seen), steps_seen
    assert any(s[3] > 0 for s in steps_seen), steps_seen
    header, row = table.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "READY", "STEP", "STALENESS", "TOKENS/S"]
    assert row.split()[0] == JOB and row.split()[2] == str(steps)
    final = host_dir / JOB / "final"
    assert (final / "config.json").exists(), sorted(str(p) for p in host_dir.rglob("*"))
    assert any(final.glob("*.safetensors"))

    # ttlSecondsAfterFinished: 30 -> the children go, the RLJob stays
    t1 = time.monotonic()
    deadline = time.monotonic() + 120
    gone: dict[str, float] = {}  # child -> seconds after success when it was gone
    left = first = _children(plane, ns)
    born: set[str] = set()  # children that appeared during the clean-up
    tq_seen: list[tuple[bool, dict[str, int]]] = []  # the TQ pod: Ready, restarts
    while left and time.monotonic() < deadline:
        time.sleep(1)
        tq_seen += _tq_pod_state(plane, ns, JOB)
        now = _children(plane, ns)
        gone.update({c: time.monotonic() - t1 for c in left if c not in now})
        born |= set(now) - set(first)
        left = now
    assert not left, left
    # until its clean-up the finished job's TransferQueue pod stays Ready (its table
    # and stats served), its driver idle, never restarted
    assert len(tq_seen) >= 5, tq_seen
    assert all(ready and not any(restarts.values()) for ready, restarts in tq_seen), tq_seen
    # owners go before their pods: the clean-up never starts a replacement pod
    assert not born, f"created during the clean-up: {sorted(born)}"
    print(f"children removed {time.monotonic() - t1:.0f}s after success: "
          + ", ".join(f"{c} {s:.0f}s" for c, s in sorted(gone.items(), key=lambda x: x[1])))
    assert _rljob(plane, ns), "the RLJob itself stays"


def _tq_pod_state(plane, ns: str, job: str) -> list[tuple[bool, dict[str, int]]]:
    """The job's TransferQueue pod, unless it is going: whether it is Ready and
    each container's restart count."""
    return [(_pod_ready(p), {c["name"]: c["restartCount"]
                             for c in p["status"].get("containerStatuses", [])})
            for p in _pods(plane, ns, f"rljob.dev/name={job},rljob.dev/role=transferqueue")
            if not p["metadata"].get("deletionTimestamp")]


def _pod_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


def _in_cluster(example: str, name: str) -> dict:
    """examples/`example` named `name`, with the cluster example's image, accelerator and
    TransferQueue requests (the CPU image, sized for the 2-core node)."""
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    cluster = yaml.safe_load((REPO / "examples/quickstart-cluster.yaml").read_text())
    doc["metadata"]["name"] = name
    for key in ("image", "accelerator", "transferQueue"):
        doc["spec"][key] = cluster["spec"][key]
    return doc


def _scrape(pod: dict, metric: str, port: int = 9090) -> float | None:
    """A counter from a pod's /metrics, read from the node (pod IPs are routable here)."""
    ip = pod.get("status", {}).get("podIP")
    if not ip:
        return None
    try:
        body = urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=3).read().decode()
    except OSError:
        return None
    values = [float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
              if line.startswith(metric + "{") or line.startswith(metric + " ")]
    return sum(values) if values else None


@pytest.mark.timeout(900)
def test_an_mcp_job_in_pods_calls_the_tool_of_its_server(operator_release, namespace):
    """examples/agentic-tools.yaml in pods with its calculator served over MCP:
    examples/tools/calculator_server.py (in the runtime image, under the pods' working
    directory /opt/rljob/examples) in rollout.mcpServers and no built-in tool; the
    policy after the example's warm-up (tests/zoo.tool_caller) on the model volume.
    The driver and the trainer start the server to list the tool their prompts
    announce, the rollout pod's episodes call it, and the job succeeds; the rollout's
    /metrics count the calls its server answered."""
    from tests import zoo

    plane = operator_release
    ns, volume = namespace
    name = "mcp-cluster"
    models = volume("models")
    # copied as new files (the pods' user reads them)
    shutil.copytree(zoo.tool_caller(), models / "tool-caller", copy_function=shutil.copyfile)
    plane.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "models"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "resources": {"requests": {"storage": "1Gi"}}}}))
    doc = _in_cluster("agentic-tools.yaml", name)
    spec = doc["spec"]
    spec["model"] = {"path": "/models/tool-caller", "pvc": "models", "dtype": "float32"}
    del spec["dataset"]["warmupPath"]  # warmed up already: no warm-up here
    spec["algorithm"].update({"promptsPerStep": 4, "maxSteps": 3})
    spec["rollout"]["tools"] = []
    spec["rollout"]["mcpServers"] = [{"name": "calc",
                                      "command": ["python", "tools/calculator_server.py"]}]
    _apply(plane, ns, doc)
    watch = Watch(plane, ns, name)
    counted: dict[str, float] = {}

    def on_poll(job: dict) -> None:
        for pod in _pods(plane, ns, f"rljob.dev/name={name},rljob.dev/role=rollout"):
            for metric in ("rljob_tool_calls_total", "rljob_tool_errors_total"):
                value = _scrape(pod, metric)
                if value is not None:
                    counted[metric] = max(counted.get(metric, 0.0), value)

    done = watch.until_succeeded(600, on_poll)
    print(f"\nMCP job Succeeded {done:.0f}s after apply; the rollout's counters {counted}")
    answered = (counted.get("rljob_tool_calls_total", 0)
                - counted.get("rljob_tool_errors_total", 0))
    assert answered >= 4, counted  # calls its server answered, of 32 episodes a step


def _scorer(plane, ns: str, image: str, key: str) -> str:
    """`rljob reward serve arith_partial` in a pod of the runtime image behind a Service
    (a scoring service a user runs beside the job), its API key from a Secret; the
    endpoint."""
    plane.kubectl("create", "secret", "generic", "-n", ns, "scorer-key",
                  f"--from-literal=apiKey={key}")
    labels = {"app": "scorer"}
    _apply(plane, ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "scorer", "labels": labels}, "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
        "containers": [{"name": "scorer", "image": image, "imagePullPolicy": "IfNotPresent",
                        "command": ["rljob", "reward", "serve", "arith_partial", "--host",
                                    "0.0.0.0", "--port", "8000"],
                        "env": [{"name": "RLJOB_REWARD_API_KEY", "valueFrom": {
                            "secretKeyRef": {"name": "scorer-key", "key": "apiKey"}}}],
                        "ports": [{"containerPort": 8000}],
                        "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}]}})
    _apply(plane, ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "scorer"},
                       "spec": {"selector": labels, "ports": [{"port": 8000}]}})
    return f"http://scorer.{ns}.svc:8000/score"


@pytest.mark.timeout(900)
def test_a_lora_job_scored_by_a_service_in_pods(operator_release, namespace):
    """examples/quickstart-lora.yaml in pods (the CPU image carries PEFT), with the
    cluster example's image and requests, its reward from a scoring service
    (reward.url, the key from reward.url.apiKeySecret) in a reward pod: the trainer
    trains the adapter, each rollout pod takes the base once and then the adapter alone
    each version (its rljob_weight_update_bytes_total: whole weights every version would
    be several times more), the reward pod scores every sample and the job succeeds."""
    plane = operator_release
    ns, _ = namespace
    name = "lora-cluster"
    doc = _in_cluster("quickstart-lora.yaml", name)
    spec = doc["spec"]
    spec["model"]["warmupSteps"] = 20
    spec["algorithm"]["maxSteps"] = 4
    spec["reward"]["url"] = {"endpoint": _scorer(plane, ns, spec["image"], "rm-key-7c2e"),
                             "apiKeySecret": "scorer-key", "timeoutSeconds": 10}
    spec["reward"]["resources"] = {"cpu": "100m", "memory": "256Mi"}
    _apply(plane, ns, doc)
    watch = Watch(plane, ns, name)
    seen: dict[str, tuple[float, float]] = {}  # pod -> (bytes, version)
    scoring: dict[str, float] = {}

    def on_poll(job: dict) -> None:
        for pod in _pods(plane, ns, f"rljob.dev/name={name},rljob.dev/role=rollout"):
            got = (_scrape(pod, "rljob_weight_update_bytes_total"),
                   _scrape(pod, "rljob_weights_version"))
            if None not in got:
                seen[pod["metadata"]["name"]] = max(seen.get(pod["metadata"]["name"],
                                                             (0.0, 0.0)), got)
        for pod in _pods(plane, ns, f"rljob.dev/name={name},rljob.dev/role=reward"):
            for metric in ("rljob_scored_samples_total", "rljob_reward_failures_total"):
                value = _scrape(pod, metric)
                if value is not None:
                    scoring[metric] = max(scoring.get(metric, 0.0), value)
        if _condition(job, "RewardReady") == "True":
            scoring["ready"] = 1.0

    done = watch.until_succeeded(600, on_poll)
    print(f"\nLoRA job scored by a service Succeeded {done:.0f}s after apply; rollout pods' "
          f"(bytes, version) {seen}; the reward pod's {scoring}")
    base, adapter = 617_600 * 4, 65_536 * 4  # the model as sent (tied head too), r = 8
    loaded = {pod: (b, v) for pod, (b, v) in seen.items() if v >= 2}
    assert loaded, seen
    for pod, (nbytes, version) in loaded.items():
        # the base once, an adapter a version loaded (the counter may be a swap ahead
        # of the version gauge)
        assert base < nbytes <= base + (version + 2) * adapter, (pod, nbytes, version)
    # 128 samples a step, scored by the service with its key (a refused key fails them)
    assert scoring.get("rljob_scored_samples_total", 0) >= 2 * 128, scoring
    assert scoring.get("rljob_reward_failures_total") == 0 and scoring.get("ready"), scoring


@pytest.mark.timeout(600)
def test_a_job_its_pods_cannot_run_fails_at_once_with_the_preflight_problems(
        operator_release, namespace):
    """The dataset's keys are checked where the dataset is, in the pods: trainer rank
    0's init container finds them missing and the job ends Failed/PreflightFailed
    with the line naming the field, without restarting the gang."""
    plane = operator_release
    ns, _ = namespace
    name = "preflight-cluster"
    doc = yaml.safe_load((REPO / "examples/quickstart-cluster.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["dataset"]["promptKey"] = "question"
    doc["spec"]["trainer"].pop("checkpointPvc")
    t0 = time.monotonic()
    _apply(plane, ns, doc)
    job: dict = {}
    while time.monotonic() - t0 < 300:
        job = _rljob(plane, ns, name)
        if _condition(job, "Failed") == "True":
            break
        time.sleep(1)
    else:
        pytest.fail(f"not Failed in 300 s: {job.get('status')}\n{_debug(plane, ns)}")
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    print(f"\nFailed/{failed['reason']} {time.monotonic() - t0:.0f}s after apply: "
          f"{failed['message']}")
    assert failed["reason"] == "PreflightFailed", failed
    assert "rows have no key 'question'" in failed["message"]
    assert "set dataset.promptKey" in failed["message"]
    assert job["status"]["trainer"]["restarts"] == 0
    events = wait_for(lambda: json.loads(plane.kubectl(  # kopf posts it after the status patch
        "get", "events", "-n", ns, "--field-selector", "reason=PreflightFailed",
        "-o", "json").stdout)["items"], 20, what="the PreflightFailed event")
    assert events and events[0]["type"] == "Warning"


def _scale_watch(watch: Watch):
    """(on_poll, scales): each scale the job's status.lastScale records, as (seconds
    after apply, step, lastScale), its entry kept current (the prediction check's
    figures join it a few steps after the scale)."""
    scales: list[tuple[float, int, dict]] = []

    def on_poll(job: dict) -> None:
        last = job.get("status", {}).get("lastScale")
        if not last:
            return
        if scales and scales[-1][2]["time"] == last["time"]:
            scales[-1] = (*scales[-1][:2], last)
        else:
            scales.append((time.monotonic() - watch.t0, watch.step(), last))

    return on_poll, scales


def _scale_report(plane, ns: str, scales: list) -> tuple[list[str], list[dict]]:
    """Lines that print each scale (δ, δ′, the source of δ′, predicted and measured
    Tgen, the error) and the ScalePredictionChecked events."""
    checked = json.loads(plane.kubectl(
        "get", "events", "-n", ns, "--field-selector", "reason=ScalePredictionChecked",
        "-o", "json").stdout)["items"]
    lines = []
    for t, step, x in scales:
        line = (f"  {t:.0f}s, step {step}: {x['from']}->{x['to']}, δ={x['delta']:.2f}s, "
                f"{'δ′' if x['to'] > x['from'] else 'cost'}={x['gain']:.2f}s "
                f"({x.get('source')}); Tgen predicted {x.get('predictedGenSeconds', 0):.2f}s")
        if "measuredGenSeconds" in x:
            line += (f", measured {x['measuredGenSeconds']:.2f}s over {x['checkedSteps']} "
                     f"steps: error {x['predictionError']:+.1%}")
        lines.append(line)
    lines += [f"  event: {e['message']}" for e in checked]
    return lines, checked


def _cpu_jiffies() -> tuple[int, int]:
    """The node's (busy, all) CPU time so far (the node is this machine)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _live_decode_ms(plane, ns: str, job: str, controller: list) -> float | None:
    """The median decode step (ms) of the live profile the job's controller holds."""
    import grpc

    from rljob.infra import auth
    from rljob.transferqueue.proto import transferqueue_pb2 as pb
    from rljob.transferqueue.proto import transferqueue_pb2_grpc as pbg

    if not controller:
        pods = json.loads(plane.kubectl("get", "pods", "-n", ns, "-l",
                                        f"rljob.dev/name={job},rljob.dev/role=transferqueue",
                                        "-o", "json").stdout)["items"]
        ips = [p["status"]["podIP"] for p in pods if _pod_ready(p)]
        if not ips:
            return None
        token, ca = _credentials(plane, ns, job)
        controller.append(auth.channel(f"{ips[0]}:50051", token=token, ca=ca))
    try:
        stats = pbg.TransferQueueControllerStub(controller[0]).Stats(pb.StatsRequest(),
                                                                     timeout=3)
    except grpc.RpcError:
        return None
    if not stats.metrics.profile:
        return None
    calls = json.loads(stats.metrics.profile)["gen_calls"]
    steps = sorted(c["decode_seconds"] / (c["steps"] - 1) for c in calls if c["steps"] > 1)
    return 1e3 * steps[len(steps) // 2] if steps else None


@pytest.mark.timeout(1800)
def test_a_generation_bound_job_scales_out_on_its_measured_gap(operator_release, namespace):
    """examples/scaleout-cluster.yaml: one slow rollout replica, a fast trainer. The
    operator reads Tgen and Ttrain from the job's TransferQueue and adds a replica
    when δ = Tgen − Ttrain ≥ δ′ for consecutiveSteps steps; δ′ comes from the job's
    live profile (its own pods' engine timings and response lengths, reported by its
    trainer); the new pod joins and generates, up to maxReplicas. Prints each scale's
    predicted and measured Tgen and steps/s with each number of replicas."""
    plane = operator_release
    ns, _ = namespace
    name = "scaleout-cluster"
    doc = yaml.safe_load((REPO / "examples/scaleout-cluster.yaml").read_text())
    # one scale and its check (the example's second scale repeats the mechanism and took
    # a third of the test's time): at most 2 replicas; 19 steps hold the live profile
    # (step 4), the 4 samples of the gap, the new replica's start and the check's 4
    # steps (run alone: the scale at step 7, the new replica Ready at step 8, the check
    # done by step 14), with 5 to spare for a slower machine; each step of one
    # replica takes about 17 s here
    doc["spec"]["rollout"]["maxReplicas"] = 2
    doc["spec"]["algorithm"]["maxSteps"] = 19
    max_steps = doc["spec"]["algorithm"]["maxSteps"]
    watch = Watch(plane, ns, name)
    record, scales = _scale_watch(watch)
    joined: dict[str, float] = {}  # new replica -> when Ready
    generated: dict[str, float] = {}  # new replica -> samples it generated (last scrape)

    looked = [0.0]
    # with 1, 2, ... replicas Ready: the node's CPU (busy, all) jiffies, and the live
    # profile's decode step (ms, the controller's record of the trainer's recent steps)
    cpu: dict[int, list[int]] = {}
    decode_ms: dict[int, float] = {}
    last_cpu = [_cpu_jiffies()]
    controller: list = []

    def on_poll(job: dict) -> None:
        record(job)
        # in one kubectl call every 3 s (a kubectl a pod a second would take CPU from
        # the replicas it measures on this 2-core node)
        if time.monotonic() - looked[0] < 3:
            return
        looked[0] = time.monotonic()
        for pod in _pods(plane, ns, f"rljob.dev/name={name},rljob.dev/role=rollout"):
            pod_name = pod["metadata"]["name"]
            if pod_name != f"{name}-rollout-0" and _pod_ready(pod):
                joined.setdefault(pod_name, time.monotonic() - watch.t0)
                samples = _scrape(pod, "rljob_generated_samples_total")
                if samples is not None:
                    generated[pod_name] = samples
        ready = 1 + len(joined)
        now_cpu = _cpu_jiffies()
        spent = cpu.setdefault(ready, [0, 0])
        spent[0] += now_cpu[0] - last_cpu[0][0]
        spent[1] += now_cpu[1] - last_cpu[0][1]
        last_cpu[0] = now_cpu
        ms = _live_decode_ms(plane, ns, name, controller)
        if ms is not None:
            decode_ms[ready] = ms

    _apply(plane, ns, doc)
    done = watch.until_succeeded(1200, on_poll)
    record(_rljob(plane, ns, name))
    events = json.loads(plane.kubectl(
        "get", "events", "-n", ns, "--field-selector", "reason=ScaledRolloutOut",
        "-o", "json").stdout)["items"]
    first = scales[0] if scales else None
    lines, checked = _scale_report(plane, ns, scales)
    report = [f"succeeded {done:.0f}s after apply; scales:", *lines,
              f"new replicas Ready at {joined}; samples they generated {generated}"]
    # steps/s with each number of replicas: from 5 s after a replica is Ready to the next
    ready = sorted(joined.values())
    starts, ends = [0.0] + [t + 5 for t in ready], [*ready, done]
    rates = [watch.rate(a, b) for a, b in zip(starts, ends)]
    if rates and rates[0]:
        report.append("steps/s with 1, 2, ... replicas: " + ", ".join(
            f"{r:.3f} ({r / rates[0]:.2f}x)" for r in rates))
    report.append("with 1, 2, ... replicas Ready: node CPU busy " + ", ".join(
        f"{b / max(a, 1):.0%}" for b, a in (cpu[n] for n in sorted(cpu)))
        + "; the live profile's decode step (4 rows) " + ", ".join(
        f"{decode_ms[n]:.1f} ms" for n in sorted(decode_ms)))
    print("\n" + "\n".join(report))
    assert first is not None, f"no scale-out: {watch.steps[-3:]}\n{_debug(plane, ns)}"
    assert first[2]["from"] == 1 and first[2]["to"] == 2, first
    # StreamRL's rule on the job's own figures: δ ≥ δ′ > 0, δ′ from its live profile
    assert first[2]["delta"] >= first[2]["gain"] > 0, first
    assert "generation lags training" in first[2]["reason"], first
    assert all(x["source"] == "live profile" for _, _, x in scales), scales
    assert scales[-1][2]["to"] == doc["spec"]["rollout"]["maxReplicas"], scales
    assert events and all("δ=" in e["message"] and "δ′=" in e["message"] for e in events), events
    assert len(events) == len(scales), (events, scales)
    # each prediction checked against the Tgen measured after it (at least the first)
    assert checked and all("predicted" in e["message"] and "error" in e["message"]
                           for e in checked), checked
    # the added replica ran for real: Ready, and it generated samples the job trained on
    assert f"{name}-rollout-1" in joined, joined
    assert generated.get(f"{name}-rollout-1", 0) > 0, generated
    assert watch.step() == max_steps
    job = _rljob(plane, ns, name)
    assert job["spec"]["rollout"]["replicas"] == scales[-1][2]["to"]
    assert _condition(job, "ProfileTrusted") == "True"


@pytest.mark.timeout(1200)
def test_a_training_bound_job_gives_a_rollout_replica_back(operator_release, namespace):
    """examples/scalein-cluster.yaml: two fast rollout replicas, a trainer held to a
    fifth of a core. With allowScaleIn the operator removes a replica once training
    lags generation by at least what one fewer replica costs (from the live
    profile) for consecutiveSteps steps; the job goes on with one replica and
    succeeds. Prints the scale with its predicted and measured Tgen."""
    plane = operator_release
    ns, _ = namespace
    name = "scalein-cluster"
    doc = yaml.safe_load((REPO / "examples/scalein-cluster.yaml").read_text())
    # 15 of the example's 20 steps (each about 8 s here): run alone, the scale came at
    # step 6 and its check's 3 steps were in by step 10; 5 to spare
    doc["spec"]["algorithm"]["maxSteps"] = 15
    watch = Watch(plane, ns, name)
    record, scales = _scale_watch(watch)
    replicas = {f"{name}-rollout-{i}" for i in range(doc["spec"]["rollout"]["replicas"])}
    gone: dict[str, float] = {}  # a replica's pod: when it was deleted (or being deleted)

    def on_poll(job: dict) -> None:
        # scale-in removes the least busy replica (not the highest index when that one
        # holds more rows), so whichever goes while the job runs
        record(job)
        if scales and not gone:
            live = set(_live_pods(plane, ns, name).get("rollout", []))
            for pod in replicas - live:
                gone[pod] = time.monotonic() - watch.t0

    _apply(plane, ns, doc)
    done = watch.until_succeeded(900, on_poll)
    record(_rljob(plane, ns, name))
    lines, _ = _scale_report(plane, ns, scales)
    print(f"\nsucceeded {done:.0f}s after apply; scales:\n" + "\n".join(lines)
          + f"\nthe removed replica's pod gone at {gone}; steps (s, step, Tgen, Ttrain): "
          + ", ".join(f"({t:.0f}, {s}, {p.get('genSeconds')}, {p.get('trainSeconds')})"
                      for t, s, p in watch.steps))
    assert scales, f"no scale-in: {watch.steps[-3:]}\n{_debug(plane, ns)}"
    first = scales[0][2]
    assert (first["from"], first["to"], first["source"]) == (2, 1, "live profile"), first
    assert "training lags generation" in first["reason"], first
    # the slack it acted on: Ttrain − Tgen at least what one fewer replica costs
    assert -first["delta"] >= first["gain"] > 0, first
    assert len(gone) == 1, gone  # one replica went while the job ran, the other stayed
    job = _rljob(plane, ns, name)
    assert job["spec"]["rollout"]["replicas"] == 1
    assert watch.step() == doc["spec"]["algorithm"]["maxSteps"]


def _live_pods(plane, ns: str, job: str) -> dict[str, list[str]]:
    """The job's pods that are not being deleted, by role."""
    by_role: dict[str, list[str]] = {}
    for p in _pods(plane, ns, f"rljob.dev/name={job}"):
        if not p["metadata"].get("deletionTimestamp"):
            by_role.setdefault(p["metadata"]["labels"]["rljob.dev/role"], []).append(
                p["metadata"]["name"])
    return by_role


def _credentials(plane, ns: str, job: str) -> tuple[str, bytes]:
    """The job's token and CA certificate, from its Secret."""
    import base64

    from rljob.api.builders import TLS_KEYS, TOKEN_KEY, secret_name
    from rljob.contract import TLS_CA_ENV

    data = json.loads(plane.kubectl("get", "secret", "-n", ns, secret_name(job),
                                    "-o", "json").stdout)["data"]
    return (base64.b64decode(data[TOKEN_KEY]).decode(),
            base64.b64decode(data[TLS_KEYS[TLS_CA_ENV]]))


def _tq_stats(plane, ns: str, job: str):
    """The TransferQueue controller's own Stats, over gRPC to its pod, asked with the
    job's token from its Secret over TLS that trusts the job's CA (its Secret's too);
    in plain text the pod refuses the handshake, and without the token the call
    (infra/tls.py, infra/auth.py)."""
    import grpc

    from rljob.infra import auth
    from rljob.transferqueue.proto import transferqueue_pb2 as pb
    from rljob.transferqueue.proto import transferqueue_pb2_grpc as pbg

    pods = json.loads(plane.kubectl("get", "pods", "-n", ns, "-l",
                                    f"rljob.dev/name={job},rljob.dev/role=transferqueue",
                                    "-o", "json").stdout)["items"]
    ready = [p["status"]["podIP"] for p in pods if _pod_ready(p)]
    assert ready, [(p["metadata"]["name"], p["status"].get("containerStatuses")) for p in pods]
    ip = ready[0]
    token, ca = _credentials(plane, ns, job)
    for outsider, code in ((grpc.insecure_channel(f"{ip}:50051"), "UNAVAILABLE"),
                           (auth.channel(f"{ip}:50051", token="", ca=ca), "UNAUTHENTICATED")):
        with outsider as channel, pytest.raises(grpc.RpcError) as refused:
            pbg.TransferQueueControllerStub(channel).Stats(pb.StatsRequest(), timeout=10)
        assert refused.value.code().name == code, refused.value
    with auth.channel(f"{ip}:50051", token=token, ca=ca) as channel:
        return pbg.TransferQueueControllerStub(channel).Stats(pb.StatsRequest(), timeout=10)


@pytest.mark.timeout(2700)
def test_the_job_survives_the_deletion_of_each_of_its_pods_and_a_power_cut(
        operator_release, namespace, node_cluster, tmp_path):
    """The cluster quickstart with Redis on its own volume (persistence: true), a
    checkpoint every 2 steps, a trainer gang of two ranks (two pods, data parallel over
    gloo), a podTemplateOverride on the workers (a label, a volume and its mount, an
    environment variable, a native sidecar) and runPolicy.notReadyTolerationSeconds.
    Mid-run, one after another: the operator's own pod, a rollout pod, trainer rank 1's
    pod (the whole gang restarts from the checkpoint), the TransferQueue pod and the
    Redis pod are deleted; then the node's power is cut (`Node.power_cut`: every
    container, containerd, the kubelet and kube-proxy killed at once, the operator's pod
    with them). The node goes NotReady; the job's pods, which tolerate that for the
    job's seconds, are evicted that long after the node's unreachable taint (the
    operator's pod, at the cluster's default 300 s, is not); the kubelet comes back and
    the job replaces every pod by itself, from its checkpoint and its Redis
    append-only file. The job still succeeds; the TransferQueue counts every row acked
    by the trainer exactly once; every step trained its own prompts; staleness never
    exceeded its bound; after the operator's restart there is never a duplicate child.
    Prints each recovery time (the fault to a Ready replacement of each pod it took,
    and to the first new step after that)."""
    from tests.chaos.test_faults import expected_digests
    from tests.cluster.kwok import Kwok

    plane = operator_release
    ns, volume = namespace
    name = "faults-cluster"
    doc = yaml.safe_load((REPO / "examples/quickstart-cluster.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    # the six faults, each armed 3 steps after the last recovery, are over by about
    # step 38 (run alone: deletions at steps 5, 9, 17, 24, 29, the power cut at 34);
    # 52 leaves steps to spare
    steps, k = 52, spec["workflow"]["maxStaleness"]
    spec["algorithm"]["maxSteps"] = steps
    # nothing here asks what the policy learns: the example's 200-step warm-up (on
    # both ranks of the gang) would only delay the first fault; 20 steps as in the
    # chaos tier
    spec["model"]["warmupSteps"] = 20
    spec["trainer"] = {"checkpointPvc": "checkpoints", "checkpointEvery": 2, "numNodes": 2}
    spec["podTemplateOverrides"] = [{
        "roles": ["trainer", "rollout"], "metadata": {"labels": {"team": "rl"}},
        "spec": {"volumes": [{"name": "scratch", "emptyDir": {}}],
                 # a sidecar that ends on SIGTERM (`sleep` as its PID 1 would not: each
                 # deleted pod would then wait out its 30 s grace period)
                 "initContainers": [{"name": "keepalive", "image": spec["image"],
                                     "command": ["sh", "-c",
                                                 "trap 'exit 0' TERM; while :; do sleep 1; done"],
                                     "restartPolicy": "Always"}]},
        "container": {"env": [{"name": "SCRATCH", "value": "/scratch"}],
                      "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}}]
    spec["transferQueue"]["leaseSeconds"] = 5
    spec["transferQueue"]["redis"].update(persistence=True, storageSize="1Gi")
    spec["runPolicy"] = {"ttlSecondsAfterFinished": 600,
                         "notReadyTolerationSeconds": NOT_READY_TOLERATION}
    host_dir = volume("checkpoints")
    volume(f"data-{name}-redis-0")  # the StatefulSet's claim for storage unit 0
    plane.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "checkpoints"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "resources": {"requests": {"storage": "1Gi"}}}}))
    job_file = tmp_path / f"{name}.yaml"
    job_file.write_text(yaml.safe_dump(doc))

    # (what, namespace, selector of what it takes, the pod deleted: None = the role's only
    # pod, POWER_CUT = the node's power). The operator first: every later fault is then
    # handled by the operator that came back, and the duplicate-children check covers
    # all of them.
    of = f"rljob.dev/name={name},rljob.dev/role="
    operator_pods = "app.kubernetes.io/name=rljob-operator"
    faults = [("operator", OPERATOR_NS, operator_pods, None),
              ("rollout", ns, of + "rollout", f"{name}-rollout-0"),
              ("trainer", ns, of + "trainer", f"{name}-trainer-1"),
              ("transferqueue", ns, of + "transferqueue", None),
              ("redis", ns, of + "storage", None),
              ("power cut", ns, f"rljob.dev/name={name}", POWER_CUT)]
    watch = Watch(plane, ns, name)
    state: dict = {"next": 0, "arm_at": 5, "fault": None}
    recoveries: list[tuple[str, int, float, float]] = []
    staleness_seen: list[int] = []
    duplicates: list[dict] = []
    outage: dict = {}  # the power cut's course

    def pods_of(namespace: str, selector: str) -> list[dict]:
        return _pods(plane, namespace, selector)

    def replaced(fault: dict) -> bool:
        """Each role the fault took has a Ready pod it did not take."""
        pods = pods_of(fault["ns"], fault["selector"])
        return all(any(_pod_ready(p) and p["metadata"]["uid"] not in fault["uids"]
                       and _role(p) == role for p in pods) for role in fault["roles"])

    def while_off(fault: dict) -> None:
        """The node off: it goes NotReady, its unreachable taint comes, the job's pods
        are evicted (deleted) for want of tolerating it longer; then power on."""
        now = time.monotonic()
        node = plane.get(f"/api/v1/nodes/{node_cluster.name}")
        if "not_ready" not in outage and not any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in node["status"].get("conditions", [])):
            outage["not_ready"] = now - fault["t"]
        taint = next((t for t in node["spec"].get("taints", [])
                      if t["key"] == "node.kubernetes.io/unreachable"
                      and t["effect"] == "NoExecute"), None)
        if taint and "tainted" not in outage:
            outage["tainted"] = datetime.fromisoformat(taint["timeAdded"]).timestamp()
        left = [p for p in pods_of(fault["ns"], fault["selector"])
                if p["metadata"]["uid"] in fault["uids"]
                and not p["metadata"].get("deletionTimestamp")]
        if "tainted" in outage and not left:
            outage["evicted_after_taint"] = time.time() - outage["tainted"]
            outage["evicted"] = now - fault["t"]
            outage["ready_after_power_on"] = node_cluster.power_on()
            fault["off"] = False

    def on_poll(job: dict) -> None:
        progress = job.get("status", {}).get("progress", {})
        if "override" not in state and watch.step() >= 2:
            # the override on a running trainer pod: its sidecar started, its variable
            # and mount in the trainer's container
            pod = json.loads(plane.kubectl("get", "pod", f"{name}-trainer-0", "-n", ns,
                                           "-o", "json").stdout)
            env = plane.kubectl("exec", "-n", ns, f"{name}-trainer-0", "-c", "trainer", "--",
                                "sh", "-c", "printenv SCRATCH && test -w /scratch && echo w",
                                check=False)
            state["override"] = (pod["metadata"]["labels"].get("team"),
                                 {c["name"]: c.get("started") for c in
                                  pod["status"].get("initContainerStatuses", [])},
                                 env.stdout.split())
        if progress.get("step"):
            staleness_seen.append(progress.get("stalenessMax", 0))
        now = time.monotonic()
        fault = state["fault"]
        if fault is not None and fault["off"]:
            while_off(fault)
        elif fault is not None:
            # recovered: a new pod of each role it took is Ready, and after that the
            # job's status shows a step it had not shown before (trained by the job as
            # it is now)
            if fault["replaced"] is None:
                if replaced(fault):
                    fault["replaced"], fault["step_then"] = now - fault["t"], watch.step()
            elif watch.step() > fault["step_then"]:
                recoveries.append((fault["what"], fault["at_step"], fault["replaced"],
                                   now - fault["t"]))
                state["fault"] = None
                state["arm_at"] = watch.step() + 3
        elif state["next"] < len(faults) and watch.step() >= state["arm_at"]:
            what, namespace, selector, victim = faults[state["next"]]
            before = pods_of(namespace, selector)
            state["fault"] = {"what": what, "ns": namespace, "selector": selector,
                              "uids": {p["metadata"]["uid"] for p in before},
                              "roles": {_role(p) for p in before},
                              "at_step": watch.step(), "replaced": None,
                              "off": victim is POWER_CUT}
            if victim is POWER_CUT:
                outage["operator"] = pods_of(OPERATOR_NS, operator_pods)[0]["metadata"]["uid"]
                node_cluster.power_cut()
            else:
                plane.kubectl("delete", "pod", victim or before[0]["metadata"]["name"],
                              "-n", namespace, "--wait=false")
            state["fault"]["t"] = time.monotonic()
            state["next"] += 1
        fault = state["fault"]
        if fault is not None and now - fault["t"] > (420 if fault["what"] == "power cut"
                                                     else 300):
            pytest.fail(f"no recovery within {now - fault['t']:.0f} s of the {fault['what']} "
                        f"fault ({fault}, {outage})\n{_debug(plane, ns)}")
        if state["next"] > 0:  # from the operator's restart on
            pods = _live_pods(plane, ns, name)
            want = {"rollout": spec["rollout"]["replicas"], "trainer": 2, "transferqueue": 1,
                    "storage": 1}
            if any(len(pods.get(role, [])) > n for role, n in want.items()):
                duplicates.append(pods)

    # a second node, simulated by kwok and kept Ready, that takes no pod (a NoSchedule
    # taint): while every node of a cluster is NotReady, the node lifecycle controller
    # takes that for its own disconnection and evicts nothing (its "master disruption
    # mode"); a cluster with one node down of several evicts
    standby = Kwok(plane).start()
    try:
        standby.add_nodes(1, "standby", taints=[{"key": "rljob.dev/standby",
                                                 "effect": "NoSchedule"}])
        _apply(plane, ns, job_file)
        # the power cut's outage shows no step for its NotReady grace, toleration and
        # restart
        done = watch.until_succeeded(2100, on_poll, stall=420)
        stats = _tq_stats(plane, ns, name)
    finally:
        standby.stop()
    print(f"\nsucceeded {done:.0f}s after apply; per fault (step shown at the fault, "
          f"s to a Ready replacement of each pod it took, s to a new step after it): "
          + ", ".join(f"{w} ({s}, {r:.1f}, {t:.1f})" for w, s, r, t in recoveries))
    assert [r[0] for r in recoveries] == [f[0] for f in faults], \
        f"not every fault was injected and recovered from: {recoveries}; steps seen (s, step): " \
        f"{[(round(t), s) for t, s, _ in watch.steps]}"
    print(f"power cut: node NotReady after {outage['not_ready']:.0f} s, the job's pods "
          f"evicted {outage['evicted_after_taint']:.0f} s after its unreachable taint "
          f"(notReadyTolerationSeconds {NOT_READY_TOLERATION}), "
          f"{outage['evicted']:.0f} s after the cut; "
          f"the node Ready {outage['ready_after_power_on']:.0f} s after power came back")
    # the job's pods went for its own toleration, not the cluster's 300 s ...
    assert NOT_READY_TOLERATION - 2 <= outage["evicted_after_taint"] <= \
        NOT_READY_TOLERATION + 30, outage
    # ... while the operator's pod, with the default, was not evicted: the kubelet that
    # came back restarted it in place
    operator_now = pods_of(OPERATOR_NS, operator_pods)
    assert [p["metadata"]["uid"] for p in operator_now] == [outage["operator"]], operator_now
    assert not duplicates, duplicates[:3]
    label, started, env = state["override"]
    assert (label, started.get("keepalive"), env) == ("rl", True, ["/scratch", "w"]), \
        state["override"]
    events = plane.kubectl("get", "events", "-n", ns, "--field-selector",
                           "involvedObject.kind=RLJob").stdout
    assert "the pod(s) of trainer rank(s) [1] went" in events, events[-2000:]

    # every row the driver released was trained exactly once: the train task acked
    # exactly a step's samples per step (rows are acked when a checkpoint holds them)
    n = spec["algorithm"]["promptsPerStep"] * spec["algorithm"]["groupSize"]
    train = {t.name: t for t in stats.tasks}["train"]
    print(f"TransferQueue: train acked {train.acked}, expired {train.expired}, "
          f"table rows {stats.rows}, cleared partitions {stats.cleared_partitions}")
    assert train.acked == n * steps, (train, stats.rows)

    from rljob.local import read_metrics

    ms = read_metrics(host_dir / name)
    assert [m["step"] for m in ms] == list(range(1, steps + 1))
    assert all(m["samples"] == n and m["rows_claimed"] == n for m in ms)
    # the job's relative paths are the image's /opt/rljob/examples: the repository's examples/
    assert [m["prompts"] for m in ms] == expected_digests(job_file, steps, REPO / "examples")
    assert max(m["staleness_max"] for m in ms) <= k
    assert staleness_seen and max(staleness_seen) <= k
    # the operator that came back converged on the same children
    pods = _live_pods(plane, ns, name)
    assert len(pods.get("transferqueue", [])) == 1 and len(pods.get("storage", [])) == 1, pods


def _role(pod: dict) -> str:
    return pod["metadata"]["labels"].get("rljob.dev/role", "")


# the node's power, as a fault (`Node.power_cut`)
POWER_CUT = object()
# seconds the job's pods stay on a NotReady node (runPolicy.notReadyTolerationSeconds);
# the node lifecycle controller taints it 50 s after its kubelet's last report
NOT_READY_TOLERATION = 15


# what a stranger tries on a running job: (name, role of the pod, port, kind); kind is
# a gRPC method (called with no token), "redis" or "http" (tests/cluster/outsider.py)
ENDPOINTS = (
    ("transferqueue", "transferqueue", 50051,
     "/rljob.transferqueue.v1.TransferQueueController/Stats"),
    ("transferqueue-metrics", "transferqueue", 9090, "http"),
    ("driver-metrics", "transferqueue", 9091, "http"),
    ("redis", "storage", 6379, "redis"),
    ("weights", "trainer", 50052, "/rljob.weights.v1.WeightService/Latest"),
    ("trainer-metrics", "trainer", 9090, "http"),
    ("rollout-metrics", "rollout", 9090, "http"),
)


# run in one of the job's pods: new connections to the controller and to Redis, with
# the credentials of the pod's environment (the token, the Redis user, the job's CA)
INSIDER = """
import os, sys
import redis
from rljob.infra import auth, tls
from rljob.transferqueue.proto import transferqueue_pb2 as pb, transferqueue_pb2_grpc as pbg
with auth.channel(sys.argv[1] + ":50051") as channel:
    pbg.TransferQueueControllerStub(channel).Stats(pb.StatsRequest(), timeout=10)
print("served")
url = f"rediss://{sys.argv[2]}:6379/0"
print(redis.Redis.from_url(url, username=os.environ["RLJOB_TQ_USER"],
                           password=os.environ["RLJOB_TQ_PASSWORD"], socket_timeout=10,
                           **tls.redis_client_kwargs(url)).ping())
"""


def _endpoints(plane, ns: str, job: str) -> tuple[list[dict], str]:
    """ENDPOINTS at the job's pods' addresses, and the image its pods run."""
    pods = {}
    for p in _pods(plane, ns, f"rljob.dev/name={job}"):
        if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp"):
            pods.setdefault(p["metadata"]["labels"]["rljob.dev/role"], p)
    image = pods["transferqueue"]["spec"]["containers"][0]["image"]
    return [{"name": n, "host": pods[role]["status"]["podIP"], "port": port, "kind": kind}
            for n, role, port, kind in ENDPOINTS], image


def _outsiders(plane, who: list[tuple[str, str]], image: str, targets: list[dict],
               on_poll) -> dict[str, dict[str, str]]:
    """Each target's outcome as each pod (namespace, name) without the job's labels
    sees it; they try at once, and `on_poll()` runs every second meanwhile."""
    script = (Path(__file__).parent / "outsider.py").read_text()
    for ns, name in who:
        _apply(plane, ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "stranger"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "enableServiceLinks": False,
                     "containers": [{"name": "try", "image": image, "imagePullPolicy": "Never",
                                     "command": ["python", "-c", script, json.dumps(targets)]}]}})
    deadline = time.monotonic() + 240
    seen: dict[str, dict[str, str]] = {}
    while len(seen) < len(who):
        assert time.monotonic() < deadline, f"strangers not done: {seen}"
        on_poll()
        time.sleep(1)
        for ns, name in who:
            phase = plane.get(f"/api/v1/namespaces/{ns}/pods/{name}").get(
                "status", {}).get("phase")
            if name in seen or phase not in ("Succeeded", "Failed"):
                continue
            out = plane.kubectl("logs", "-n", ns, name, check=False).stdout
            plane.kubectl("delete", "pod", "-n", ns, name, "--wait=false", check=False)
            assert phase == "Succeeded", out[-3000:]
            seen[name] = json.loads(out.strip().splitlines()[-1])
    return seen


@pytest.mark.timeout(1800)
def test_a_stranger_is_refused_by_the_credentials_and_then_by_the_enforced_policy(
        operator_release, namespace, node_cluster, images_on_node):
    """The cluster quickstart runs; pods that are not the job's (one in another
    namespace, one in the job's own without its labels) try every endpoint of it.
    Without an enforcer (as with the policy deleted) each server refuses plain text
    (TLS), and over TLS each gRPC server answers UNAUTHENTICATED and Redis NOAUTH; the metrics ports answer (read-only, guarded by
    the policy alone). Then SIG Network's kube-network-policies enforces the job's
    NetworkPolicy on the node: every connection of theirs goes unanswered, while the
    job's own pods keep training and the operator (admitted by the policy) keeps
    reading its progress, and the job's pods open new connections to each other. Then
    `helm upgrade` of the operator to a new image (the same layers, a label more:
    another digest): its pod is replaced by one of the new image, which reads the
    job's progress through the policy too, and no pod of the job is deleted or
    created from the upgrade to the job's last step. The job trains each step's rows
    exactly once. The release goes back to its image after."""
    from tests.cluster.netpol import Enforcer

    plane = operator_release
    ns, volume = namespace
    host_dir = volume("quickstart-checkpoints")
    plane.kubectl("apply", "-n", ns, "-f", str(REPO / "examples/k8s/quickstart-cluster-pvc.yaml"))
    doc = yaml.safe_load((REPO / "examples/quickstart-cluster.yaml").read_text())
    # long enough (about 1.5 s a step here) to run through both rounds of strangers and
    # the upgrade: run beside other tests, they were over by step 36; 28 to spare
    steps = doc["spec"]["algorithm"]["maxSteps"] = 64
    doc["spec"]["model"]["warmupSteps"] = 20
    _apply(plane, ns, doc)
    watch = Watch(plane, ns, JOB)
    while watch.step() < 2:  # the job trains: every role is up
        assert time.monotonic() - watch.t0 < 600, _debug(plane, ns)
        watch.poll()
        time.sleep(1)
    policy = json.loads(plane.kubectl("get", "networkpolicy", "-n", ns, f"{JOB}-ingress",
                                      "-o", "json").stdout)
    assert policy["metadata"]["ownerReferences"][0]["name"] == JOB
    targets, image = _endpoints(plane, ns, JOB)
    other = f"{ns[:50]}-stranger"
    plane.kubectl("create", "namespace", other)
    try:
        who = [(other, "stranger-other-ns"), (ns, "stranger-same-ns")]
        open_ = _outsiders(plane, who, image, targets, watch.poll)
        print(f"\nno policy enforced: {json.dumps(open_, indent=1)}")
        for seen in open_.values():
            # TLS (transferQueue.tls) refuses plain text; over TLS, the token and the
            # Redis user refuse them
            assert seen["transferqueue"] == seen["weights"] == "grpc over TLS: UNAUTHENTICATED", seen
            assert seen["redis"].startswith("redis over TLS: ") and "NOAUTH" in seen["redis"], seen
            assert all(seen[m] == "http: 200" for m in seen if m.endswith("metrics")), seen
        enforcer = Enforcer(node_cluster).start()
        try:
            step_before = watch.step()
            # connections made under the policy: one of the job's pods opens new ones to
            # the controller and to Redis, with the job's credentials: served
            hosts = {t["name"]: t["host"] for t in targets}
            insider = plane.kubectl(
                "exec", "-n", ns, f"{JOB}-trainer-0", "-c", "trainer", "--", "python", "-c",
                INSIDER, hosts["transferqueue"], hosts["redis"], check=False, timeout=60)
            assert insider.stdout.split() == ["served", "True"], insider
            # and the operator upgraded to a new image under the running job: its new
            # pod (another namespace) connects to the controller through the policy to
            # read the job's progress; the job's pods stay as they are
            pods = _pod_uids(plane, ns, JOB)
            upgraded = _upgrade_operator(plane, images_on_node)
            closed = _outsiders(plane, [(n, f"{w}-2") for n, w in who], image, targets, watch.poll)
            print(f"policy enforced from step {step_before}: {json.dumps(closed, indent=1)}")
            for seen in closed.values():
                assert set(seen.values()) == {"timeout"}, \
                    f"{seen}\n{targets}\n{_debug(plane, ns)}\nenforcer:\n{enforcer.logs()}"
            out = plane.kubectl("-n", OPERATOR_NS, "rollout", "status", f"deploy/{RELEASE}",
                                "--timeout=120s", timeout=150, check=False)
            assert out.returncode == 0, out.stderr
            t_replaced = time.monotonic() - watch.t0  # only the new operator from here on
            running = [p["spec"]["containers"][0]["image"] for p in _pods(
                plane, OPERATOR_NS, "app.kubernetes.io/name=rljob-operator")
                if not p["metadata"].get("deletionTimestamp")]
            assert running == [upgraded], running
            changed: list = []

            def unchanged(job: dict) -> None:
                """A pod of the job created, or one gone before its last step."""
                now = _pod_uids(plane, ns, JOB)
                if set(now.values()) - set(pods.values()) or (
                        set(pods.values()) - set(now.values()) and watch.step() < steps):
                    changed.append((watch.step(), now))

            succeeded = watch.until_succeeded(900, unchanged)
            stats = _tq_stats(plane, ns, JOB)
        finally:
            enforcer.stop()
    finally:
        plane.kubectl("delete", "namespace", other, "--wait=false", check=False)
        _upgrade_operator(plane, images_on_node, back=True)
    assert not changed, (pods, changed[:3])
    shown = [s for _, s, _ in watch.steps]
    after = [s for t, s, _ in watch.steps if t > t_replaced]
    print(f"steps shown {shown}, {after} after the operator was upgraded to {upgraded}; "
          f"succeeded {succeeded:.0f}s after apply")
    # the new operator (another namespace, admitted on the controller's port) read the
    # steps the job trained while the policy held
    assert shown[-1] == steps and len(after) >= 2, shown
    n = doc["spec"]["algorithm"]["promptsPerStep"] * doc["spec"]["algorithm"]["groupSize"]
    train = {t.name: t for t in stats.tasks}["train"]
    assert train.acked == n * steps, (train, stats.rows)
    from rljob.local import read_metrics

    ms = read_metrics(host_dir / JOB)
    assert [m["step"] for m in ms] == list(range(1, steps + 1))
    assert all(m["samples"] == n and m["rows_claimed"] == n for m in ms)


def _upgrade_operator(plane, images_on_node, back: bool = False) -> str:
    """`helm upgrade` of the release to a new operator image, the pushed one with a
    label more (another digest, its layers the registry's already); `back`: to the
    pushed one again, waiting for its pod. Returns the image the release names."""
    repository, digest = _pinned(images_on_node, "operator").split("@")
    image = f"{repository}@{digest}"
    if not back:
        image = images_on_node["registry"].relabel(image, f"{repository}:upgrade",
                                                   {"rljob.dev/build": "upgrade"})
        assert image.split("@")[1] != digest, image
    helm(plane, "upgrade", RELEASE, str(CHART), "-n", OPERATOR_NS, "--reuse-values",
         "--set", f"image.digest={image.split('@')[1]}", check=not back)
    if back:
        plane.kubectl("-n", OPERATOR_NS, "rollout", "status", f"deploy/{RELEASE}",
                      "--timeout=120s", timeout=150, check=False)
    return image


def _until_suspended(plane, ns: str, name: str, reason: str,
                     timeout: float) -> tuple[dict, dict[str, dict]]:
    """The job and its conditions by type, once its Suspended condition shows
    `reason` (polled once a second; fails after `timeout` s with its status)."""
    deadline = time.monotonic() + timeout
    while True:
        job = _rljob(plane, ns, name)
        conds = {c["type"]: c for c in job.get("status", {}).get("conditions", [])}
        if conds.get("Suspended", {}).get("reason") == reason:
            return job, conds
        assert time.monotonic() < deadline, (job.get("status"), _debug(plane, ns))
        time.sleep(1)


def _pod_uids(plane, ns: str, job: str) -> dict[str, str]:
    """The uids of a job's pods not being deleted, by name."""
    return {p["metadata"]["name"]: p["metadata"]["uid"]
            for p in _pods(plane, ns, f"rljob.dev/name={job}")
            if not p["metadata"].get("deletionTimestamp")}


def _uids(plane, ns: str, job: str) -> dict[str, str]:
    """The uids of a job's TransferQueue and storage pods, by name."""
    return {p["metadata"]["name"]: p["metadata"]["uid"]
            for role in ("transferqueue", "storage")
            for p in _pods(plane, ns, f"rljob.dev/name={job},rljob.dev/role={role}")}


def _queued_job(name: str, steps: int, queue_name: str, priority: str, ttl: int = 0,
                **trainer) -> dict:
    """The cluster quickstart, short and without its warm-up, in a LocalQueue (its
    children go `ttl` seconds after it ends: the node's CPU requests fit a few jobs)."""
    doc = yaml.safe_load((REPO / "examples/quickstart-cluster.yaml").read_text())
    doc["metadata"] = {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue_name,
                                                "kueue.x-k8s.io/priority-class": priority}}
    spec = doc["spec"]
    spec["model"]["warmupSteps"] = 0
    spec["algorithm"]["maxSteps"] = steps
    spec["trainer"] = trainer
    spec["runPolicy"] = {"ttlSecondsAfterFinished": ttl}
    return doc


def _crd_before(added: tuple[str, ...]) -> dict:
    """The chart's CRD as the release before this one had it: without the field it
    added (`added`: its path under spec) (pure but for reading the file)."""
    crd = yaml.safe_load((CHART / "crds" / "rljob.yaml").read_text())
    node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for key in added[:-1]:
        node = node["properties"][key]
    del node["properties"][added[-1]]
    return crd


# the field this release's CRD adds (runPolicy.notReadyTolerationSeconds)
ADDED_FIELD = ("runPolicy", "notReadyTolerationSeconds")


@pytest.mark.timeout(1800)
def test_kueue_queues_admits_preempts_and_resumes_jobs(operator_release, namespace,
                                                       node_cluster, images_on_node, tmp_path):
    """A real Kueue (tests/cluster/kueue.py) with a ClusterQueue whose CPU fits one job
    (each asks 500m: its TransferQueue, Redis and the trainer's preflight) and a
    flavor that names the node. `first` runs; `second` waits (Suspended: Queued,
    QuotaReserved False, a Queued event) until `first` finishes, then is admitted and
    its pods carry the flavor's node label. Mid-run, `urgent` (a higher
    WorkloadPriorityClass) preempts it: `second` is suspended (its trainer
    checkpoints), its quota given back, `urgent` runs and finishes, and `second` is
    admitted again and resumes from its checkpoint: every step trained once, every
    row acked once.
    The jobs start under the release before's CRD (one field fewer); while `urgent`
    runs and `second` waits, the upgrade the operator guide gives: the new CRD applied,
    then `helm upgrade` to a new operator image. The new operator adopts both jobs:
    no pod of either is deleted or created by it (urgent's until its last step,
    second's TransferQueue and Redis throughout), both Workloads are the ones the old
    operator made, urgent's status goes on showing steps, and second is admitted again
    and resumed by it."""
    from tests.chaos.test_faults import expected_digests
    from tests.cluster import kueue

    plane = operator_release
    ns, volume = namespace
    image = node_cluster.import_binary_image("kueue")
    took = kueue.install(plane, image)
    print(f"\nKueue installed and answering in {took:.0f}s")
    plane.kubectl("apply", "-f", "-", input=json.dumps(_crd_before(ADDED_FIELD)))
    upgrade: dict = {}
    try:
        kueue.priority_class(plane, "rljob-low", 10)
        kueue.priority_class(plane, "rljob-high", 1000)
        cq = f"cq-{ns}"[:63]
        host = {"kubernetes.io/hostname": node_cluster.name}
        kueue.queues(plane, ns, cq, "team", cpu="700m", node_labels=host)
        steps = 8
        host_dir = volume("checkpoints")
        plane.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "checkpoints"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "resources": {"requests": {"storage": "1Gi"}}}}))
        first = _queued_job("first", 3, "team", "rljob-low")
        second = _queued_job("second", steps, "team", "rljob-low", ttl=600,
                             checkpointPvc="checkpoints", checkpointEvery=2)
        # long enough to run on after the upgrade's new operator is Ready
        urgent_steps = 24
        urgent = _queued_job("urgent", urgent_steps, "team", "rljob-high")
        second_file = tmp_path / "second.yaml"
        second_file.write_text(yaml.safe_dump(second))
        _apply(plane, ns, first)
        wait_first = Watch(plane, ns, "first")
        deadline = time.monotonic() + 300
        while _condition(_rljob(plane, ns, "first"), "Admitted") != "True":
            assert time.monotonic() < deadline, (_rljob(plane, ns, "first").get("status"),
                                                 kueue.debug(plane))
            time.sleep(1)
        _apply(plane, ns, second)
        # second waits: suspended, Queued, its Workload without quota
        job, conds = _until_suspended(plane, ns, "second", "Queued", 120)
        assert job["spec"]["suspend"] is True
        assert conds["QuotaReserved"]["status"] == "False", conds
        assert not _pods(plane, ns, "rljob.dev/name=second"), "a queued job holds no pods"
        events = plane.kubectl("get", "events", "-n", ns, "--field-selector",
                               "involvedObject.name=second").stdout
        assert "Queued" in events, events

        wait_first.until_succeeded(600)
        watch = Watch(plane, ns, "second")
        urgent_watch = Watch(plane, ns, "urgent")
        state = {"urgent": None, "evicted": None, "pods": None, "tables": None}
        changed: list = []

        def on_poll(job: dict) -> None:
            conds = {c["type"]: c for c in job.get("status", {}).get("conditions", [])}
            if state["pods"] is None and conds.get("TrainerReady", {}).get("status") == "True":
                state["pods"] = _pods(plane, ns, "rljob.dev/name=second,rljob.dev/role=trainer")
                state["tables"] = _uids(plane, ns, "second")
            if state["urgent"] is None and watch.step() >= 3:
                _apply(plane, ns, urgent)
                state["urgent"] = watch.step()
            if (state["urgent"] is not None and state["evicted"] is None
                    and conds.get("Suspended", {}).get("reason") == "Evicted"):
                state["evicted"] = watch.step()
            if state["evicted"] is None:
                return
            urgent_job = urgent_watch.poll()
            if not upgrade and urgent_watch.step() >= 1:
                upgrade.update(_upgrade_under(plane, ns, images_on_node, urgent_watch))
            elif upgrade and _condition(urgent_job, "Succeeded") != "True":
                now = _pod_uids(plane, ns, "urgent")
                before = upgrade["pods"]
                if set(now.values()) - set(before.values()) or (
                        set(before.values()) - set(now.values())
                        and urgent_watch.step() < urgent_steps):
                    changed.append((urgent_watch.step(), now))

        done = watch.until_succeeded(1200, on_poll, stall=600)
        urgent_job = _rljob(plane, ns, "urgent")
        print(f"second succeeded {done:.0f}s after first; urgent applied at step "
              f"{state['urgent']}, second evicted at step {state['evicted']}; steps seen "
              f"{[(round(t), s) for t, s, _ in watch.steps]}")
        assert state["evicted"] is not None, f"second was never evicted: {kueue.debug(plane)}"
        # its trainer checkpointed on the eviction: the status never shows a step back
        seen = [s for _, s, _ in watch.steps]
        assert seen == sorted(seen), watch.steps
        assert _condition(urgent_job, "Succeeded") == "True", urgent_job.get("status")
        # the admission's flavor: its node label in the trainer's pod
        assert state["pods"] and all(
            p["spec"].get("nodeSelector", {}).get("kubernetes.io/hostname") == node_cluster.name
            for p in state["pods"]), [p["spec"].get("nodeSelector") for p in state["pods"] or []]
        events = plane.kubectl("get", "events", "-n", ns, "--field-selector",
                               "involvedObject.name=second").stdout
        for reason in ("Admitted", "QuotaReleased"):
            assert reason in events, events
        # every step trained once, its own prompts, through the preemption
        stats = _tq_stats(plane, ns, "second")
        n = second["spec"]["algorithm"]["promptsPerStep"] * second["spec"]["algorithm"]["groupSize"]
        train = {t.name: t for t in stats.tasks}["train"]
        print(f"TransferQueue of second: train acked {train.acked} of {n * steps}, table "
              f"rows {stats.rows}")
        from rljob.local import read_metrics

        ms = read_metrics(host_dir / "second")
        assert [m["step"] for m in ms] == list(range(1, steps + 1))
        assert all(m["samples"] == n for m in ms)
        assert [m["prompts"] for m in ms] == expected_digests(second_file, steps,
                                                              REPO / "examples")
        # the Workloads are finished and free (no finalizer left): the operator's next
        # reconcile after each job's end
        def free() -> list[dict]:
            wls = plane.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads")["items"]
            return wls if len(wls) == 3 and all(
                _condition(w, "Finished") == "True" and not w["metadata"].get("finalizers")
                for w in wls) else []
        deadline = time.monotonic() + 60
        while not free():
            assert time.monotonic() < deadline, ([
                (w["metadata"]["name"], w["metadata"].get("finalizers"),
                 _condition(w, "Finished")) for w in plane.get(
                    f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads")["items"]],
                _debug(plane, ns))
            time.sleep(1)
        # the TransferQueue and its storage ran on through the eviction (their pods
        # were not rebuilt): the one table counts every row acked once
        assert len(state["tables"] or {}) == 2, state["tables"]
        assert _uids(plane, ns, "second") == state["tables"]
        assert train.acked == n * steps, (train, stats.rows)
        # the upgrade: the new operator adopted both jobs, their pods and Workloads
        after = [s for t, s, _ in urgent_watch.steps if t > upgrade["ready_at"]]
        print(f"operator upgraded to {upgrade['image']} at urgent's step "
              f"{upgrade['step']}, Ready {upgrade['took']:.0f}s later; urgent's steps "
              f"shown after: {after}")
        assert not changed, (upgrade["pods"], changed[:3])
        assert after and after[-1] == urgent_steps, urgent_watch.steps
        assert {w["metadata"]["name"]: w["metadata"]["uid"] for w in plane.get(
            f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads")["items"]
            if w["metadata"]["name"] in upgrade["workloads"]} == upgrade["workloads"]
        assert sorted(w.split("-")[1] for w in upgrade["workloads"]) == ["second", "urgent"], \
            upgrade["workloads"]
    finally:
        plane.kubectl("apply", "-f", str(CHART / "crds"), check=False)
        if upgrade:
            _upgrade_operator(plane, images_on_node, back=True)
        kueue.uninstall(plane, image)


def _upgrade_under(plane, ns: str, images_on_node, running: Watch) -> dict:
    """The operator guide's upgrade while `running` trains: the chart's CRD applied
    (`kubectl apply -f charts/rljob-operator/crds/`), then `helm upgrade` to a new
    operator image, waited for; what it found (the running job's pods, the
    namespace's Workloads by name) and when the new operator was Ready (seconds since
    `running`'s watch began)."""
    found = {"pods": _pod_uids(plane, ns, running.job), "step": running.step(),
             "workloads": {w["metadata"]["name"]: w["metadata"]["uid"] for w in plane.get(
                 f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads")["items"]
                 if not _condition(w, "Finished") == "True"}}
    t0 = time.monotonic()
    plane.kubectl("apply", "-f", str(CHART / "crds"))
    found["image"] = _upgrade_operator(plane, images_on_node)
    out = plane.kubectl("-n", OPERATOR_NS, "rollout", "status", f"deploy/{RELEASE}",
                        "--timeout=120s", timeout=150, check=False)
    assert out.returncode == 0, out.stderr
    found["took"] = time.monotonic() - t0
    found["ready_at"] = time.monotonic() - running.t0
    return found


@pytest.mark.timeout(900)
def test_an_elastic_job_scales_out_and_in_through_kueue(operator_release, namespace,
                                                       node_cluster):
    """A queued job that opts in to Kueue's elastic workloads
    (`kueue.x-k8s.io/elastic-job: "true"`; the ElasticJobsViaWorkloadSlices gate on in
    the test's Kueue) under a ClusterQueue whose memory holds the job with three
    rollout replicas of 1500Mi, not four. Running at two, `kubectl scale` (the path
    the autoscaler writes too) to three: the operator asks Kueue for a slice of the
    Workload with three, Kueue charges the difference, finishes the slice it replaces,
    and the job adopts it and adds the replica. To four: the slice does not fit; the
    job says it waits (ScaleAdmitted False, WaitingForQuota) and runs on at three. To
    two: the waiting slice is withdrawn, a replica goes, and the admitted Workload's
    rollout count is lowered in place: the ClusterQueue's reservation drops by one
    replica's memory. The job trains throughout."""
    from rljob.api.builders import quantity
    from tests.cluster import kueue

    plane = operator_release
    ns, _ = namespace
    image = node_cluster.import_binary_image("kueue")
    kueue.install(plane, image)
    replica = 1500 * 2**20
    try:
        kueue.priority_class(plane, "rljob-low", 10)
        cq = f"cq-el-{ns}"[:63]
        # the job asks 1Gi besides its rollouts (TransferQueue and driver, Redis, the
        # trainer's preflight: 256Mi each): 1Gi + 3 x 1500Mi fit 5600Mi, 4 do not
        kueue.queues(plane, ns, cq, "team", cpu="16", memory="5600Mi",
                     node_labels={"kubernetes.io/hostname": node_cluster.name})
        doc = _queued_job("elastic", 1000, "team", "rljob-low")
        doc["metadata"]["annotations"] = {"kueue.x-k8s.io/elastic-job": "true"}
        doc["spec"]["rollout"]["resources"] = {"memory": "1500Mi"}
        _apply(plane, ns, doc)
        watch = Watch(plane, ns, "elastic")
        wls = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads"

        def reserved() -> float:
            status = plane.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{cq}").get(
                "status", {})
            return sum(quantity(r["total"]) for f in status.get("flavorsReservation") or []
                       for r in f.get("resources") or [] if r["name"] == "memory")

        def rollouts() -> int:
            return sum(1 for p in _pods(plane, ns, "rljob.dev/name=elastic,rljob.dev/role=rollout")
                       if _pod_ready(p) and not p["metadata"].get("deletionTimestamp"))

        def scale_condition(job: dict) -> dict:
            return next((c for c in job.get("status", {}).get("conditions", [])
                         if c["type"] == "ScaleAdmitted"), {})

        def until(what: str, check, timeout: float = 240) -> float:
            t0 = time.monotonic()
            while True:
                job = watch.poll()
                if check(job):
                    return time.monotonic() - t0
                assert time.monotonic() - t0 < timeout, (
                    f"{what}: not within {timeout:.0f} s; {scale_condition(job)}\n"
                    f"{json.dumps([(w['metadata']['name'], w['spec']['podSets'][-1]['count'], w.get('status', {}).get('conditions')) for w in plane.get(wls)['items']], indent=1)}"
                    f"\n{kueue.debug(plane)}\n{_debug(plane, ns)}")
                time.sleep(1)

        until("running at two replicas", lambda j: watch.step() >= 2 and rollouts() == 2)
        base = reserved()
        scale = lambda n: plane.kubectl("scale", "rljob", "elastic", "-n", ns,  # noqa: E731
                                        f"--replicas={n}")
        scale(3)
        took = until("three replicas admitted and Ready", lambda j: rollouts() == 3 and (
            j["metadata"].get("annotations", {}).get("rljob.dev/workload-slice") == "1"))
        by_name = {w["metadata"]["name"]: w for w in plane.get(wls)["items"]}
        [first] = [w for n, w in by_name.items() if not n.endswith("-s1")]
        [slice1] = [w for n, w in by_name.items() if n.endswith("-s1")]
        replaced = next(c for c in first["status"]["conditions"] if c["type"] == "Finished")
        assert (replaced["status"], replaced["reason"]) == ("True", "WorkloadSliceReplaced"), \
            replaced
        assert _condition(slice1, "Admitted") == "True", slice1.get("status")
        assert reserved() - base == replica, (base, reserved())
        out_step = watch.step()

        scale(4)
        until("the fourth replica waiting for quota", lambda j: scale_condition(j).get(
            "reason") == "WaitingForQuota")
        time.sleep(10)  # Kueue has had its chance: the slice does not fit
        job = watch.poll()
        [waiting] = [w for w in plane.get(wls)["items"] if w["metadata"]["name"].endswith("-s2")]
        assert _condition(waiting, "QuotaReserved") != "True", waiting.get("status")
        assert rollouts() == 3 and job["spec"]["rollout"]["replicas"] == 4
        assert job["status"]["rollout"]["replicas"] == 3, job["status"]["rollout"]
        assert reserved() - base == replica
        message = scale_condition(job)["message"]
        assert "4 rollout replicas asked" in message and "3 run" in message, message

        scale(2)
        took_in = until("back at two, the quota given back", lambda j: rollouts() == 2 and (
            reserved() == base) and not any(w["metadata"]["name"].endswith("-s2")
                                            for w in plane.get(wls)["items"]))
        [slice1] = [w for w in plane.get(wls)["items"] if w["metadata"]["name"].endswith("-s1")]
        assert slice1["spec"]["podSets"][-1]["count"] == 2, slice1["spec"]["podSets"]
        assert _condition(slice1, "Admitted") == "True"
        until("a step after scaling in", lambda j: watch.step() > out_step + 2, 300)
        events = plane.kubectl("get", "events", "-n", ns, "--field-selector",
                               "involvedObject.name=elastic").stdout
        for reason in ("ScaleQueued", "ScaleAdmitted", "ScaleWithdrawn", "QuotaReturned"):
            assert reason in events, events
        print(f"\nelastic under Kueue: 2 → 3 replicas admitted and Ready in {took:.0f}s "
              f"(reservation +{replica / 2**20:.0f}Mi), 4 waited for quota at 3, 2 in "
              f"{took_in:.0f}s (reservation back to {base / 2**20:.0f}Mi); steps "
              f"{[s for _, s, _ in watch.steps][:3]}...{watch.step()}")
    finally:
        plane.kubectl("delete", "rljob", "elastic", "-n", ns, "--wait=false", check=False)
        kueue.uninstall(plane, image)


def _node_free_cpu(plane, node: str) -> float:
    """The node's allocatable CPU less the requests of the pods bound to it that have
    not ended (the scheduler's arithmetic; operator/rljob_operator/capacity.py)."""
    from rljob_operator import capacity

    nodes = plane.get(f"/api/v1/nodes/{node}")
    pods = plane.get("/api/v1/pods")["items"]
    return capacity.free_nodes([nodes], pods)[0].free["cpu"]


@pytest.mark.timeout(600)
def test_a_job_larger_than_the_free_node_waits_whole_and_starts_when_room_frees(
        operator_release, namespace, node_cluster):
    """Neither Kueue nor a gang scheduler: a pod holds all of the node's free CPU but
    0.3 core, and the quickstart (its TransferQueue, Redis and trainer's preflight ask
    0.5) is applied. It creates nothing — no pod, no Service, not even its TransferQueue
    holding part of the node — and says why: Suspended, reason WaitingForCapacity,
    naming the pod that does not fit, and a WaitingForCapacity event. Once the other
    pod goes, the job starts on its own (the operator checks again each reconcile)."""
    plane = node_cluster.plane
    ns, _ = namespace
    # pods of earlier tests still going would free room during the test: wait them out
    deadline = time.monotonic() + 180
    while any(p["metadata"].get("deletionTimestamp")
              for p in plane.get("/api/v1/pods")["items"]):
        assert time.monotonic() < deadline, _debug(plane, ns)
        time.sleep(1)
    free = _node_free_cpu(plane, node_cluster.name)
    hold = round(free - 0.3, 3)
    assert hold > 0, f"the node has only {free} CPU free"
    plane.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "main", "image": node_cluster.images["probe"], "imagePullPolicy": "Never",
            "args": ["serve", ":8080"], "resources": {"requests": {"cpu": f"{hold}"}}}]}}))
    doc = yaml.safe_load((REPO / "examples/quickstart-cluster.yaml").read_text())
    doc["metadata"] = {"name": "waits"}
    doc["spec"]["model"]["warmupSteps"] = 0
    doc["spec"]["trainer"] = {}
    _apply(plane, ns, doc)
    _, conds = _until_suspended(plane, ns, "waits", "WaitingForCapacity", 60)
    message = conds["Suspended"]["message"]
    print(f"\nSuspended: {message}")
    assert conds["Suspended"]["status"] == "True"
    assert "do not fit" in message and node_cluster.name in message, message
    time.sleep(3)  # a few reconciles (every 2 s here): still nothing of it
    assert not _pods(plane, ns, "rljob.dev/name=waits"), "a waiting job holds no pod"
    services = plane.get(f"/api/v1/namespaces/{ns}/services")["items"]
    assert not services, [s["metadata"]["name"] for s in services]
    events = plane.kubectl("get", "events", "-n", ns, "--field-selector",
                           "involvedObject.name=waits").stdout
    assert "WaitingForCapacity" in events, events

    plane.kubectl("delete", "pod", "holder", "-n", ns, "--wait=false")
    deadline = time.monotonic() + 120
    while not _pods(plane, ns, "rljob.dev/name=waits,rljob.dev/role=transferqueue"):
        assert time.monotonic() < deadline, (_rljob(plane, ns, "waits").get("status"),
                                             _debug(plane, ns))
        time.sleep(1)
    deadline = time.monotonic() + 60
    while _condition(_rljob(plane, ns, "waits"), "Suspended") != "False":
        assert time.monotonic() < deadline, _rljob(plane, ns, "waits").get("status")
        time.sleep(1)
    plane.kubectl("delete", "rljob", "waits", "-n", ns, "--wait=false")
