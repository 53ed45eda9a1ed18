"""The Helm chart: lint clean in both scopes, its CRD is the generated one,
namespace mode grants a Role per watched namespace and no job ClusterRole."""

from __future__ import annotations

import json

import yaml

from tests.cluster.operator_harness import CHART, helm
from tests.cluster.controlplane import REPO


def test_chart_crd_is_the_generated_crd():
    assert (CHART / "crds" / "rljob.yaml").read_bytes() == (REPO / "crds" / "rljob.yaml").read_bytes(), (
        "charts/rljob-operator/crds/rljob.yaml differs from crds/rljob.yaml: "
        "cp crds/rljob.yaml charts/rljob-operator/crds/")


def test_helm_lint_clean_in_every_mode(cluster):
    for args in ([], ["--set", "scope=namespace", "--set", "watchNamespaces={a,b}"],
                 ["--set", "peering.enabled=true", "--set", "replicaCount=2",
                  "--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true",
                  "--set", "grafanaDashboard.enabled=true"]):
        out = helm(cluster, "lint", "--strict", str(CHART), *args)
        assert "0 chart(s) failed" in out.stdout, out.stdout


def render(cluster, *args: str) -> list[dict]:
    out = helm(cluster, "template", "rel", str(CHART), "--namespace", "ops",
               "--kube-version", "v1.34.4", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_namespace_scope_grants_roles_only_where_it_watches(cluster):
    docs = render(cluster, "--set", "scope=namespace", "--set", "watchNamespaces={team-a,team-b}")
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs
             if d["kind"] in ("Role", "ClusterRole")}
    assert roles == {("Role", "team-a", "rel-rljob-operator"),
                     ("Role", "team-b", "rel-rljob-operator"),
                     ("ClusterRole", None, "rel-rljob-operator-discovery"),
                     # the users' roles (aggregated into edit/admin and view)
                     ("ClusterRole", None, "rel-rljob-operator-edit"),
                     ("ClusterRole", None, "rel-rljob-operator-view")}
    discovery = next(d for d in docs if d["kind"] == "ClusterRole")
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in discovery["rules"])
    dep = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RLJOB_OPERATOR_NAMESPACES"] == "team-a team-b"


def test_the_capacity_check_reads_nodes_and_pods_and_can_be_turned_off(cluster):
    """capacityCheck (default on): list on nodes and pods cluster-wide, and the flag in
    the operator's environment; off, neither."""
    for args, on in (((), True), (("--set", "capacityCheck=false"), False)):
        docs = render(cluster, *args)
        discovery = next(d for d in docs if d["kind"] == "ClusterRole"
                         and d["metadata"]["name"].endswith("-discovery"))
        reads = [r for r in discovery["rules"] if r["apiGroups"] == [""]
                 and "nodes" in r["resources"]]
        assert (reads == [{"apiGroups": [""], "resources": ["nodes", "pods"],
                           "verbs": ["list"]}]) is on, discovery["rules"]
        dep = next(d for d in docs if d["kind"] == "Deployment")
        env = {e["name"]: e.get("value")
               for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RLJOB_OPERATOR_CAPACITY_CHECK"] == ("true" if on else "false")


def test_cluster_scope_default_and_peering_replicas(cluster):
    docs = render(cluster)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole"] * 4 + ["ClusterRoleBinding", "ClusterRoleBinding",
                                            "Deployment", "NetworkPolicy", "Service",
                                            "ServiceAccount"]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["resources"]["limits"]["memory"]
    assert not [d for d in docs if "kopf" in str(d)]  # no peering CRDs without peering
    docs = render(cluster, "--set", "peering.enabled=true", "--set", "replicaCount=2",
                  "--set", "serviceMonitor.enabled=true")
    crds = {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert crds == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert "ServiceMonitor" in {d["kind"] for d in docs}
    # the operator creates its own peering object, so it may create one
    discovery = next(d for d in docs if d["metadata"]["name"] == "rel-rljob-operator-discovery")
    assert any("clusterkopfpeerings" in r["resources"] and "create" in r["verbs"]
               for r in discovery["rules"])
    other = render(cluster, "--set", "peering.enabled=true", "--set", "peering.installCRDs=false")
    assert not [d for d in other if d["kind"] == "CustomResourceDefinition"]
    bad = helm(cluster, "template", "rel", str(CHART), "--kube-version", "v1.34.4",
               "--set", "replicaCount=2", check=False)
    assert bad.returncode != 0 and "peering.enabled" in bad.stderr


def test_network_policies_for_the_jobs_and_the_operator_follow_the_values(cluster):
    """networkPolicy: the operator's pod admits only the monitoring namespaces on its
    metrics port; the operator is told to give each job its policy (and may), with
    its namespace and the monitoring namespaces; off, neither."""
    docs = render(cluster, "--set", "networkPolicy.monitoringNamespaces={obs,prom}")
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "rljob-operator", "app.kubernetes.io/instance": "rel"}
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9090}]
    assert rule["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "obs", "prom"]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value", e.get("valueFrom"))
           for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RLJOB_OPERATOR_NETWORK_POLICY"] == "true"
    assert env["RLJOB_OPERATOR_MONITORING_NAMESPACES"] == "obs prom"
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    role = next(d for d in docs if d["kind"] == "ClusterRole"
                and d["metadata"]["name"] == "rel-rljob-operator")
    assert any(r["resources"] == ["networkpolicies"] and {"create", "patch"} <= set(r["verbs"])
               for r in role["rules"])
    off = render(cluster, "--set", "networkPolicy.enabled=false")
    assert "NetworkPolicy" not in {d["kind"] for d in off}
    dep = next(d for d in off if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RLJOB_OPERATOR_NETWORK_POLICY"] == "false"
    none = render(cluster, "--set", "networkPolicy.monitoringNamespaces=null")
    assert next(d for d in none if d["kind"] == "NetworkPolicy")["spec"]["ingress"] == []


def test_users_roles_aggregate_into_edit_and_view_and_runtime_image_reaches_the_operator(cluster):
    docs = render(cluster, "--set", "runtimeImage=registry.example/rljob/runtime:0.1.0")
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    edit, view = roles["rel-rljob-operator-edit"], roles["rel-rljob-operator-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert "create" in edit["rules"][0]["verbs"] and "rljobs" in edit["rules"][0]["resources"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert all(set(r["verbs"]) == {"get", "list", "watch"} for r in view["rules"])
    dep = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RLJOB_RUNTIME_IMAGE"] == "registry.example/rljob/runtime:0.1.0"
    plain = render(cluster, "--set", "aggregateRoles=false")
    assert sum(d["kind"] == "ClusterRole" for d in plain) == 2
    dep = next(d for d in plain if d["kind"] == "Deployment")
    assert "RLJOB_RUNTIME_IMAGE" not in {e["name"] for e in
                                         dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == f"rljob/operator:{version}"
    # the operator's image by digest, as python -m images.push prints it
    digest = "sha256:" + "d6" * 32
    pinned = render(cluster, "--set", "image.repository=registry.example/ml/operator",
                    "--set", f"image.digest={digest}", "--set", "image.tag=ignored")
    dep = next(d for d in pinned if d["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == \
        f"registry.example/ml/operator@{digest}"


def test_monitoring_objects_select_the_jobs_and_ship_the_dashboard(cluster):
    docs = render(cluster, "--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true",
                  "--set", "grafanaDashboard.enabled=true")
    by_kind = {d["kind"]: d for d in docs}
    sm = by_kind["ServiceMonitor"]
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True  # the operator's namespace label
    pm = by_kind["PodMonitor"]["spec"]
    assert pm["namespaceSelector"] == {"any": True}
    assert pm["selector"]["matchExpressions"] == [{"key": "rljob.dev/name", "operator": "Exists"}]
    assert [e["port"] for e in pm["podMetricsEndpoints"]] == ["metrics", "driver-metrics"]
    targets = {r["targetLabel"] for r in pm["podMetricsEndpoints"][0]["relabelings"]}
    assert targets == {"rljob", "role"}
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["rljob.json"]) == json.loads(
        (CHART / "dashboards" / "rljob.json").read_text())
    ns = render(cluster, "--set", "scope=namespace", "--set", "watchNamespaces={a,b}",
                "--set", "podMonitor.enabled=true")
    pm = next(d for d in ns if d["kind"] == "PodMonitor")["spec"]
    assert pm["namespaceSelector"] == {"matchNames": ["a", "b"]}
