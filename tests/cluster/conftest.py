"""Real control planes (etcd + kube-apiserver) shared by all cluster tests: a plain
one, and one with a real node (kubelet, containerd) for the ``node`` tests."""

from __future__ import annotations

import time

import pytest

from tests.cluster.controlplane import ControlPlane, gotools_bin
from tests.tiers import unavailable


@pytest.fixture(scope="session")
def bin_dir():
    return gotools_bin()


@pytest.fixture(scope="session")
def cluster(bin_dir):
    # the controller-manager runs Deployments/StatefulSets into pods and garbage-
    # collects an RLJob's children when it is deleted (operator tests)
    plane = ControlPlane(bin_dir, with_controller_manager=True).start()
    print(f"\ncontrol plane ready in {plane.start_seconds:.1f}s at {plane.server}")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def crd_installed(cluster):
    from tests.cluster.controlplane import REPO

    cluster.kubectl("apply", "-f", str(REPO / "crds"))
    cluster.wait_established("rljobs.rljob.dev")
    return cluster


@pytest.fixture(scope="session")
def node_cluster(bin_dir):
    """A control plane with one real node that runs pods (tests/cluster/node.py).
    Skipped where a node cannot run (not root, or the Debian packages missing), and a
    failure there where the test command set the node tier up (tests/tiers.py)."""
    from tests.cluster.node import Node, missing_requirements, node_executables, processes_of

    missing = missing_requirements()
    if missing:
        unavailable("node", "a node cannot run here: " + "; ".join(missing))
    started = time.monotonic()
    preexisting = processes_of(node_executables(bin_dir))
    plane = ControlPlane(bin_dir, for_node=True).start()
    try:
        node = Node(plane, bin_dir).start()
    except BaseException:
        plane.stop()
        raise
    node.timings["plane"] = plane.start_seconds
    node.timings["total_ready"] = plane.start_seconds + node.timings["ready"]
    node.timings["total"] = time.monotonic() - started
    node.preexisting_processes = preexisting
    print(f"\nnode {node.name} at {plane.node_ip}: "
          + ", ".join(f"{k} {v:.1f}s" for k, v in node.timings.items()))
    try:
        yield node
    finally:
        node.stop()
        plane.stop()


# stops the shared node, so it runs after every other test
LAST = "tests/cluster/test_node.py::test_teardown_leaves_nothing"


def pytest_collection_modifyitems(items):
    for item in items:
        if "/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
    items.sort(key=lambda item: item.nodeid.endswith(LAST))
