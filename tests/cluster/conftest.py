"""Session-scoped real control plane (etcd + kube-apiserver) for cluster tests."""

from __future__ import annotations

import pytest

from tests.cluster.controlplane import ControlPlane, gotools_bin


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
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/rljobs.rljob.dev")
    return cluster


def pytest_collection_modifyitems(items):
    for item in items:
        if "/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
