"""Simulated nodes for the scale bench: kwok's controller (sigs.k8s.io/kwok, built by
tests/gotools/build.sh) against the test control plane.

Nodes are real Node objects, created here with what the Ascend device plugin
advertises (`huawei.com/Ascend910`: 8 a node) and kwok's annotation; kwok keeps them
Ready (its node stages) and plays the pods the scheduler binds to them: Running and
Ready once bound, gone once deleted (its "fast" pod stages, of the same tag). No
container runs: the control plane, the scheduler, Kueue and the operator do all of
their work, the nodes none.
"""

from __future__ import annotations

import json

from tests.cluster.controlplane import ControlPlane, stop_process

ANNOTATION = "kwok.x-k8s.io/node"
NPU = "huawei.com/Ascend910"
ACCELERATOR_LABEL = {"accelerator": "huawei-Ascend910"}
# the stages kwok plays, as its release ships them (kustomize/stage of its tag)
STAGES = ("node/fast/node-initialize.yaml",
          "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
          "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml")


def node(name: str, npus: int = 8, cpu: str = "192", memory: str = "1536Gi",
         taints: list[dict] | None = None) -> dict:
    """A simulated Ascend node: a 910B server's NPUs, cores and memory."""
    size = {"cpu": cpu, "memory": memory, "pods": "110", NPU: str(npus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                    **ACCELERATOR_LABEL}},
            "spec": {"taints": list(taints or [])},
            "status": {"allocatable": size, "capacity": size}}


class Kwok:
    """kwok's controller as a process of `plane` (stopped with it)."""

    def __init__(self, plane: ControlPlane):
        self.plane = plane
        self.proc = None
        self.nodes: list[str] = []

    def start(self) -> Kwok:
        stages = self.plane.bin_dir / "kwok-stages"
        config = self.plane.workdir / "kwok.yaml"
        config.write_text("\n---\n".join((stages / s).read_text() for s in STAGES))
        self.proc = self.plane.spawn("kwok", [
            str(self.plane.bin_dir / "kwok"), f"--kubeconfig={self.plane.kubeconfig}",
            f"--config={config}", "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={ANNOTATION}=fake",
            "--node-lease-duration-seconds=40", "--cidr=10.0.0.0/16",
        ])
        return self

    def add_nodes(self, count: int, prefix: str = "kwok-node",
                  taints: list[dict] | None = None) -> list[str]:
        names = [f"{prefix}-{i}" for i in range(count)]
        text = "\n".join(json.dumps(node(n, taints=taints)) for n in names)
        self.plane.kubectl("create", "-f", "-", input=text, timeout=300)
        self.nodes += names
        return names

    def stop(self) -> None:
        """Its nodes deleted and its controller stopped, before the plane stops."""
        if self.nodes:
            self.plane.kubectl("delete", "nodes", *self.nodes, "--wait=false", check=False)
            self.nodes = []
        if self.proc is not None:
            stop_process(self.proc)
            self.plane.procs.remove(self.proc)
            self.proc = None

    def ready_nodes(self) -> int:
        nodes = self.plane.get("/api/v1/nodes").get("items", [])
        return sum(1 for n in nodes for c in (n.get("status") or {}).get("conditions") or []
                   if c["type"] == "Ready" and c["status"] == "True")

