"""The RLJob CRD against a real kube-apiserver + etcd, driven with kubectl."""

from __future__ import annotations

import json

import pytest

from rljob.api import RLJob
from rljob.api.validation import check_document
from tests.cases import CEL_NOISE, EXAMPLES, INVALID, TEN_LINE_YAML, minimal



@pytest.fixture
def ns(crd_installed):
    with crd_installed.namespace("t") as name:
        yield name


def get_json(cluster, ns, name):
    return json.loads(cluster.kubectl("-n", ns, "get", "rljob", name, "-o", "json").stdout)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(crd_installed, ns, path):
    out = crd_installed.kubectl("-n", ns, "apply", "-f", str(path))
    assert "created" in out.stdout


def test_ten_line_yaml_gets_the_models_defaults(crd_installed, ns):
    crd_installed.kubectl("-n", ns, "apply", "-f", "-", input=TEN_LINE_YAML)
    stored = get_json(crd_installed, ns, "minimal")["spec"]
    assert stored == RLJob.model_validate(minimal()).spec.to_wire()


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_rljobs_are_rejected_with_the_offline_message(crd_installed, ns, case):
    out = crd_installed.kubectl("-n", ns, "create", "-f", "-",
                                input=json.dumps(case.document()), check=False)
    assert out.returncode != 0, f"{case.id} was admitted"
    assert case.expect in out.stderr, out.stderr
    # `rljob validate` says the same thing, word for word (less the apiserver's
    # `Invalid value: "object": ` before a CEL rule's message)
    for problem in check_document(case.document()):
        assert problem.text in out.stderr.replace(CEL_NOISE, ""), (problem.text, out.stderr)


PROGRESS = {
    "observedGeneration": 1,
    "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady", "message": "",
                    "lastTransitionTime": "2026-11-22T00:00:00Z"}],
    "progress": {"step": 12, "stalenessMean": 0.75, "stalenessMax": 1,
                 "tokensPerSecond": 1234.5, "genSeconds": 10.5, "trainSeconds": 8.25},
    "rollout": {"replicas": 2, "readyReplicas": 2,
                "selector": "rljob.name=cols,rljob.role=rollout"},
}


def patch_status(cluster, ns, name, status):
    return cluster.kubectl("-n", ns, "patch", "rljob", name, "--subresource=status",
                           "--type=merge", "-p", json.dumps({"status": status}))


def test_kubectl_get_prints_the_columns(crd_installed, ns):
    doc = minimal("cols")
    crd_installed.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(doc))
    patch_status(crd_installed, ns, "cols", PROGRESS)
    table = crd_installed.kubectl("-n", ns, "get", "rljobs").stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "STEP", "STALENESS", "TOKENS/S", "ROLLOUTS", "AGE"]
    assert table[1].split()[:6] == ["cols", "True", "12", "0.75", "1234.5", "1"]
    wide = crd_installed.kubectl("-n", ns, "get", "rlj", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-3:] == ["MODE", "GEN-S", "TRAIN-S"]
    assert wide[1].split()[-3:] == ["async", "10.5", "8.25"]


def test_kubectl_scale_goes_through_the_scale_subresource(crd_installed, ns):
    doc = minimal("scaled")
    doc["spec"]["rollout"] = {"replicas": 1, "maxReplicas": 4}
    crd_installed.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(doc))
    patch_status(crd_installed, ns, "scaled", {"rollout": PROGRESS["rollout"]})
    crd_installed.kubectl("-n", ns, "scale", "rljob/scaled", "--replicas=3")
    assert get_json(crd_installed, ns, "scaled")["spec"]["rollout"]["replicas"] == 3
    scale = json.loads(crd_installed.kubectl(
        "get", "--raw", f"/apis/rljob.dev/v1alpha1/namespaces/{ns}/rljobs/scaled/scale").stdout)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    assert scale["status"] == {"replicas": 2, "selector": "rljob.name=cols,rljob.role=rollout"}
    # the spec's rules still hold on the scale path
    out = crd_installed.kubectl("-n", ns, "scale", "rljob/scaled", "--replicas=5", check=False)
    assert out.returncode != 0
    assert "rollout.replicas must be at most rollout.maxReplicas" in out.stderr


def test_status_is_writable_only_through_the_status_subresource(crd_installed, ns):
    crd_installed.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(minimal("st")))
    crd_installed.kubectl("-n", ns, "patch", "rljob", "st", "--type=merge",
                          "-p", json.dumps({"status": {"progress": {"step": 99}}}))
    assert "status" not in get_json(crd_installed, ns, "st")
    patch_status(crd_installed, ns, "st", {"progress": {"step": 7},
                                           "trainer": {"readyNodes": 1}})
    job = get_json(crd_installed, ns, "st")
    assert job["status"]["progress"]["step"] == 7
    # and spec changes sent to the status subresource are ignored
    crd_installed.kubectl("-n", ns, "patch", "rljob", "st", "--subresource=status",
                          "--type=merge", "-p", json.dumps({"spec": {"suspend": True}}))
    assert get_json(crd_installed, ns, "st")["spec"]["suspend"] is False
    assert RLJob.model_validate(get_json(crd_installed, ns, "st")).status.progress.step == 7


def test_trainer_shape_is_immutable_while_running(crd_installed, ns):
    crd_installed.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(minimal("run")))
    change = json.dumps({"spec": {"trainer": {"numNodes": 2}}})
    # not started yet: the shape may change
    crd_installed.kubectl("-n", ns, "patch", "rljob", "run", "--type=merge", "-p", change)
    patch_status(crd_installed, ns, "run", {"startTime": "2026-11-22T00:00:00Z"})
    out = crd_installed.kubectl("-n", ns, "patch", "rljob", "run", "--type=merge", "-p",
                                json.dumps({"spec": {"trainer": {"numNodes": 3}}}), check=False)
    assert out.returncode != 0
    assert "spec.trainer is immutable while the job runs" in out.stderr
    crd_installed.kubectl("-n", ns, "patch", "rljob", "run", "--type=merge",
                          "-p", json.dumps({"spec": {"suspend": True}}))
    crd_installed.kubectl("-n", ns, "patch", "rljob", "run", "--type=merge",
                          "-p", json.dumps({"spec": {"trainer": {"numNodes": 3}}}))
    assert get_json(crd_installed, ns, "run")["spec"]["trainer"]["numNodes"] == 3


def test_managed_by_is_immutable(crd_installed, ns):
    doc = minimal("mb")
    doc["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    crd_installed.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(doc))
    for change in ({"managedBy": "rljob.dev/operator"}, {"managedBy": None}):
        out = crd_installed.kubectl("-n", ns, "patch", "rljob", "mb", "--type=merge", "-p",
                                    json.dumps({"spec": change}), check=False)
        assert out.returncode != 0, change
        assert "spec.managedBy is immutable" in out.stderr
    assert get_json(crd_installed, ns, "mb")["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"


def test_pod_template_overrides_are_stored_as_written(crd_installed, ns):
    """Kubernetes objects in an override (a volume's source, affinity, a sidecar's
    command) pass the schema untouched; the apiserver's defaults are the models'."""
    from tests.unit.test_pod_overrides import OVERRIDES

    doc = minimal("ovr")
    doc["spec"]["podTemplateOverrides"] = OVERRIDES
    crd_installed.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(doc))
    stored = get_json(crd_installed, ns, "ovr")["spec"]
    assert stored == RLJob.model_validate(doc).spec.to_wire()
    assert stored["podTemplateOverrides"][0]["spec"]["affinity"] == OVERRIDES[0]["spec"]["affinity"]
    assert stored["podTemplateOverrides"][0]["spec"]["containers"][0]["command"] == [
        "sleep", "infinity"]
