"""A real node: it goes Ready, runs pods from locally packed images, pods reach each
other through a ClusterIP Service by its DNS name (kube-proxy + CoreDNS), and
stopping it leaves the machine as it was."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.cluster.node import (BRIDGE, HostState, links, netns_entries, node_executables,
                                processes_of, read_sysctls)

pytestmark = pytest.mark.node


def _pod(name: str, image: str, args: list[str], labels: dict | None = None,
         restart: str = "Always") -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                            "args": args}],
        },
    })


def _wait_phase(node, ns: str, pod: str, phases: set[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    phase = ""
    while time.monotonic() < deadline:
        status = node.api_get(f"/api/v1/namespaces/{ns}/pods/{pod}")["status"]
        phase = status.get("phase", "")
        if phase in phases:
            return phase
        if phase == "Failed":
            break
        time.sleep(0.2)
    described = node.plane.kubectl("describe", "pod", pod, "-n", ns, check=False).stdout
    raise AssertionError(f"pod {ns}/{pod} is {phase!r}, not in {phases}:\n{described}\n"
                         f"kubelet:\n{node.log_tail('kubelet')}")


def test_node_is_ready(node_cluster):
    node = node_cluster
    info = json.loads(node.plane.kubectl("get", "node", node.name, "-o", "json").stdout)
    ready = {c["type"]: c["status"] for c in info["status"]["conditions"]}
    assert ready["Ready"] == "True", info["status"]["conditions"]
    assert info["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert not [t for t in info["spec"].get("taints", [])
                if t["key"] == "node.kubernetes.io/not-ready"]
    print(f"\nnode Ready {node.timings['total_ready']:.1f}s after nothing "
          f"(control plane {node.timings['plane']:.1f}s, then node {node.timings['ready']:.1f}s)")


def test_pod_runs_and_kubelet_serves_exec_and_logs(node_cluster):
    node, plane = node_cluster, node_cluster.plane
    with plane.namespace("node") as ns:
        t0 = time.monotonic()
        plane.kubectl("apply", "-n", ns, "-f", "-",
                      input=_pod("web", node.images["probe"], ["serve", ":8080"]))
        _wait_phase(node, ns, "web", {"Running"})
        running = time.monotonic() - t0
        print(f"\npod create -> Running {running:.1f}s")
        # the apiserver reaches the kubelet with its client certificate
        deadline = time.monotonic() + 30
        while "serving on :8080" not in (logs := plane.kubectl(
                "logs", "-n", ns, "web", check=False).stdout) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "serving on :8080 as web" in logs
        got = plane.kubectl("exec", "-n", ns, "web", "--", "/probe", "get",
                            "http://127.0.0.1:8080/").stdout
        assert got.strip() == "web"


def test_pods_reach_a_service_by_its_dns_name(node_cluster):
    node, plane = node_cluster, node_cluster.plane
    probe = node.images["probe"]
    with plane.namespace("node") as ns:
        plane.kubectl("apply", "-n", ns, "-f", "-",
                      input=_pod("echo", probe, ["serve", ":8080"], labels={"app": "echo"}))
        plane.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo"},
            "spec": {"selector": {"app": "echo"},
                     "ports": [{"port": 80, "targetPort": 8080}]},
        }))
        _wait_phase(node, ns, "echo", {"Running"})
        cluster_ip = node.api_get(f"/api/v1/namespaces/{ns}/services/echo")["spec"]["clusterIP"]
        fqdn = f"echo.{ns}.svc.cluster.local"

        # another pod: resolve the name through CoreDNS, dial the ClusterIP (kube-proxy
        # DNATs it to the echo pod), print the answer
        t0 = time.monotonic()
        plane.kubectl("apply", "-n", ns, "-f", "-", input=_pod(
            "client", probe, ["get", f"http://{fqdn}/", "60"], restart="Never"))
        _wait_phase(node, ns, "client", {"Succeeded"})
        print(f"\nclient pod create -> Succeeded (DNS + Service) {time.monotonic() - t0:.1f}s")
        # (earlier lines: tries refused until kube-proxy has programmed the Service)
        logs = plane.kubectl("logs", "-n", ns, "client").stdout
        assert logs.splitlines()[-1] == "echo", logs

        # the name is CoreDNS's answer: the Service's ClusterIP, by full name and by
        # <svc>.<ns> through the pod's search domains
        for name in (fqdn, f"echo.{ns}"):
            addrs = plane.kubectl("exec", "-n", ns, "echo", "--", "/probe", "resolve",
                                  name).stdout.split()
            assert addrs == [cluster_ip], (name, addrs)
        # a pod reaches itself through its Service (hairpin)
        got = plane.kubectl("exec", "-n", ns, "echo", "--", "/probe", "get",
                            f"http://{fqdn}/", "10").stdout
        assert got.strip() == "echo"


def test_teardown_leaves_nothing(node_cluster, bin_dir):
    """Runs last (see conftest): stops the shared node and control plane."""
    node, plane = node_cluster, node_cluster.plane
    before: HostState = node.before
    executables = node_executables(bin_dir)
    workdir = node.workdir

    node.stop()
    t0 = time.monotonic()
    plane.stop()
    print(f"\nteardown: node {node.timings['teardown']:.1f}s, "
          f"control plane {time.monotonic() - t0:.1f}s")

    left = {pid: exe for pid, exe in processes_of(executables).items()
            if pid not in node.preexisting_processes}
    assert not left, f"processes left: {left}"
    assert BRIDGE not in links() or BRIDGE in before.links
    assert links() == before.links
    for family in ("iptables", "ip6tables"):
        dump = subprocess.run([f"{family}-save"], capture_output=True, text=True,
                              env=dict(os.environ, PATH="/usr/sbin:/sbin:" + os.environ["PATH"]),
                              ).stdout
        kube = {line for line in dump.splitlines() if "KUBE-" in line or "CNI-" in line}
        had = any(c.startswith(("KUBE-", "CNI-"))
                  for cs in before.chains[family].values() for c in cs)
        assert not kube or had, f"{family}: {sorted(kube)[:10]}"
        assert not any(before.our_chains(family).values())
    assert read_sysctls() == before.sysctls
    assert netns_entries() == before.netns
    assert HostState.capture().paths == before.paths
    assert HostState.capture().cgroups == before.cgroups
    assert not workdir.exists() or os.environ.get("RLJOB_KEEP_CLUSTER_DIR")
