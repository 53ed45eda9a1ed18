"""spec.podTemplateOverrides and spec.managedBy: the builders add what a platform team
writes to the pods of the roles it names, and the names it may not take are exactly
the ones the operator's own pods use."""

from __future__ import annotations

import pytest

from rljob.api import RLJob, builders as b
from rljob.api.resource import transition_failures
from rljob.api.validation import check_document
from rljob.contract import (
    OWN_ANNOTATIONS,
    OWN_CONTAINERS,
    OWN_ENV,
    OWN_ENV_PREFIX,
    OWN_KEY_PREFIX,
    OWN_LABELS,
    OWN_MOUNT_PATHS,
    OWN_PORTS,
    OWN_VOLUMES,
)
from tests.cases import minimal

OVERRIDES = [
    {"roles": ["trainer", "rollout"],
     "metadata": {"labels": {"team": "rl"}, "annotations": {"cost-center": "42"}},
     "spec": {"nodeSelector": {"pool": "train", "zone": "b"},
              "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl",
                               "effect": "NoSchedule"}],
              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                  "nodeSelectorTerms": [{"matchExpressions": [
                      {"key": "gen", "operator": "In", "values": ["a3"]}]}]}}},
              "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}},
                          {"name": "ckpt-copy", "persistentVolumeClaim": {"claimName": "ck"}}],
              "containers": [{"name": "uploader", "image": "busybox:1.36",
                              "command": ["sleep", "infinity"],
                              "ports": [{"containerPort": 8080}],
                              "volumeMounts": [{"name": "ckpt-copy", "mountPath": "/ck",
                                                "readOnly": True}]}],
              "initContainers": [{"name": "warm-cache", "image": "busybox:1.36",
                                  "restartPolicy": "Always"}],
              "imagePullSecrets": [{"name": "registry"}],
              "serviceAccountName": "rl-runner",
              "schedulingGates": [{"name": "example.com/quota"}]},
     "container": {"env": [{"name": "HF_HOME", "value": "/cache/hf"},
                           {"name": "TOKEN", "valueFrom": {"secretKeyRef": {
                               "name": "tok", "key": "t"}}}],
                   "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}},
    {"roles": ["trainer"], "metadata": {"labels": {"gang": "yes"}}},
    {"roles": ["transferqueue", "storage"],
     "spec": {"tolerations": [{"key": "infra", "operator": "Exists"}]},
     "container": {"env": [{"name": "EXTRA", "value": "1"}]}},
]


def job_with(**spec) -> RLJob:
    doc = minimal("ovr")
    doc["metadata"]["namespace"] = "team-a"
    doc["spec"].update(spec)
    return RLJob.model_validate(doc)


def pods(objs: list[dict]) -> dict[str, tuple[dict, dict]]:
    """(metadata, spec) of every pod and pod template, by role."""
    out = {}
    for o in objs:
        if o["kind"] == "Pod":
            out[o["metadata"]["name"]] = (o["metadata"], o["spec"])
        elif o["kind"] in ("Deployment", "StatefulSet"):
            t = o["spec"]["template"]
            out[o["metadata"]["name"]] = (t["metadata"], t["spec"])
    return out


def test_the_operators_own_pods_use_only_the_names_kept_from_overrides():
    """Every name the builders give a pod is among those an override may not take, so
    no override (that passed the rules) can collide with the operator's pods."""
    job = job_with(
        accelerator={"type": "ascend", "nodeSelector": {"npu": "910b"},
                     "hccl": {"socketIfname": "eth0", "ifBasePort": 60000}},
        model={"path": "/models/m", "pvc": "models"}, dataset={"path": "/data/d.jsonl",
                                                              "pvc": "data"},
        trainer={"numNodes": 2, "npusPerNode": 2, "checkpointPvc": "ck"},
        transferQueue={"redis": {"persistence": True}},
        scheduling={"schedulerName": "volcano", "queue": "q"},
        logging={"wandb": {"project": "p", "apiKeySecret": "wandb"}})
    seen = pods(b.build_all(job, "pw"))
    assert {"ovr-trainer-0", "ovr-trainer-1", "ovr-rollout-0", "ovr-tq", "ovr-redis"} <= set(seen)
    for name, (meta, spec) in seen.items():
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        assert {c["name"] for c in containers} <= set(OWN_CONTAINERS), name
        assert {v["name"] for v in spec.get("volumes", [])} <= set(OWN_VOLUMES), name
        for c in containers:
            assert {m["mountPath"] for m in c.get("volumeMounts", [])} <= set(OWN_MOUNT_PATHS)
            assert {p["containerPort"] for p in c.get("ports", [])} <= set(OWN_PORTS), name
            assert all(e["name"] in OWN_ENV or e["name"].startswith(OWN_ENV_PREFIX)
                       for e in c.get("env", [])), (name, c["env"])
        assert all(k.startswith(OWN_KEY_PREFIX) or k in OWN_LABELS for k in meta["labels"])
        assert all(k.startswith(OWN_KEY_PREFIX) or k in OWN_ANNOTATIONS
                   for k in meta.get("annotations", {})), name


def test_overrides_reach_the_pods_of_the_roles_they_name_in_order():
    job = job_with(podTemplateOverrides=OVERRIDES, accelerator={"nodeSelector": {"zone": "a"}},
                   trainer={"checkpointPvc": "ck"})
    before = pods(b.build_all(job_with(trainer={"checkpointPvc": "ck"}), "pw"))
    seen = pods(b.build_all(job, "pw"))
    meta, spec = seen["ovr-trainer-0"]
    assert meta["labels"]["team"] == "rl" and meta["labels"]["gang"] == "yes"
    assert meta["labels"]["rljob.dev/role"] == "trainer"
    assert meta["annotations"]["cost-center"] == "42"
    # the override's key over accelerator.nodeSelector's, the rest of both kept
    assert spec["nodeSelector"] == {"zone": "b", "pool": "train"}
    assert spec["tolerations"] == [OVERRIDES[0]["spec"]["tolerations"][0]]
    assert spec["affinity"] == OVERRIDES[0]["spec"]["affinity"]
    # volumes and sidecars as written (their untyped fields kept), after the operator's
    names = [v["name"] for v in spec["volumes"]]
    assert names == [v["name"] for v in before["ovr-trainer-0"][1]["volumes"]] + [
        "cache", "ckpt-copy"]
    assert spec["volumes"][-2] == OVERRIDES[0]["spec"]["volumes"][0]
    assert spec["containers"][-1] == {**OVERRIDES[0]["spec"]["containers"][0]}
    # the platform's init container first, then the operator's preflight
    assert [c["name"] for c in spec["initContainers"]] == ["warm-cache", "preflight"]
    assert spec["initContainers"][0]["restartPolicy"] == "Always"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["serviceAccountName"] == "rl-runner"
    assert spec["schedulingGates"] == [{"name": "example.com/quota"}]
    # env and mounts on the trainer and its preflight, after the operator's own
    for c in (spec["containers"][0], spec["initContainers"][1]):
        own = next(x for x in before["ovr-trainer-0"][1]["containers"] +
                   before["ovr-trainer-0"][1]["initContainers"] if x["name"] == c["name"])
        assert c["env"] == own["env"] + OVERRIDES[0]["container"]["env"]
        assert c["volumeMounts"] == own["volumeMounts"] + [
            {"name": "cache", "mountPath": "/cache"}]
    # the sidecar gets none of the role's env
    assert "env" not in spec["containers"][-1]

    meta, spec = seen["ovr-rollout-0"]
    assert meta["labels"]["team"] == "rl" and "gang" not in meta["labels"]
    assert [c["name"] for c in spec["containers"]] == ["rollout", "uploader"]

    for name, own in (("ovr-tq", ["transferqueue", "driver"]), ("ovr-redis", ["redis"])):
        meta, spec = seen[name]
        assert "team" not in meta["labels"]
        assert spec["tolerations"] == [{"key": "infra", "operator": "Exists"}]
        assert [c["name"] for c in spec["containers"]] == own
        assert all(c["env"][-1] == {"name": "EXTRA", "value": "1"} for c in spec["containers"])
    # without overrides, nothing of theirs
    assert "tolerations" not in before["ovr-tq"][1]


def test_an_override_survives_the_wire_as_written():
    job = job_with(podTemplateOverrides=OVERRIDES)
    again = RLJob.model_validate(job.to_wire())
    assert pods(b.build_all(again, "pw")) == pods(b.build_all(job, "pw"))
    wire = job.to_wire()["spec"]["podTemplateOverrides"][0]
    assert wire["spec"]["containers"][0]["command"] == ["sleep", "infinity"]
    assert wire["container"]["env"][1]["valueFrom"] == {"secretKeyRef": {"name": "tok",
                                                                         "key": "t"}}


@pytest.mark.parametrize("override, says", [
    ({"roles": ["trainer"], "metadata": {"labels": {"rljob.dev/rank": "9"}}},
     "spec.podTemplateOverrides[0].metadata.labels: keys under rljob.dev/"),
    ({"roles": ["trainer"], "metadata": {"labels": {"app.kubernetes.io/instance": "x"}}},
     "spec.podTemplateOverrides[0].metadata.labels: keys under rljob.dev/"),
    ({"roles": ["trainer"], "metadata": {"annotations": {"rljob.dev/gang-restart": "0"}}},
     "spec.podTemplateOverrides[0].metadata.annotations: keys under rljob.dev/"),
    ({"roles": ["rollout"], "spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}},
     "spec.podTemplateOverrides[0].spec.volumes: job, models, data, dshm"),
    ({"roles": ["rollout"], "spec": {"containers": [{"name": "rollout", "image": "x"}]}},
     "spec.podTemplateOverrides[0].spec.containers: trainer, rollout"),
    ({"roles": ["rollout"], "spec": {"initContainers": [{"name": "preflight", "image": "x"}]}},
     "spec.podTemplateOverrides[0].spec.initContainers: trainer, rollout"),
    ({"roles": ["rollout"], "spec": {"containers": [
        {"name": "side", "image": "x", "ports": [{"containerPort": 9090}]}]}},
     "spec.podTemplateOverrides[0].spec.containers: ports 50051"),
    ({"roles": ["trainer"], "container": {"env": [{"name": "WORLD_SIZE", "value": "4"}]}},
     "spec.podTemplateOverrides[0].container.env: RLJOB_* and the variables"),
    ({"roles": ["trainer"], "container": {"env": [{"name": "RLJOB_TQ_PASSWORD", "value": "x"}]}},
     "spec.podTemplateOverrides[0].container.env: RLJOB_* and the variables"),
    ({"roles": ["trainer"], "spec": {"volumes": [{"name": "v", "emptyDir": {}}]},
      "container": {"volumeMounts": [{"name": "v", "mountPath": "/checkpoints/mine"}]}},
     "spec.podTemplateOverrides[0].container.volumeMounts: /etc/rljob"),
    ({"roles": ["trainer"], "container": {"volumeMounts": [{"name": "job", "mountPath": "/x"}]}},
     "every volumeMounts[].name must be a volume of the override's spec.volumes"),
    ({"roles": ["driver"]}, 'spec.podTemplateOverrides[0].roles[0]: Unsupported value: "driver"'),
    ({"roles": []}, "spec.podTemplateOverrides[0].roles"),
])
def test_an_override_that_would_touch_the_operators_pods_is_refused(override, says):
    doc = minimal("ovr")
    doc["spec"]["podTemplateOverrides"] = [override]
    problems = [p.text for p in check_document(doc)]
    assert any(says in p for p in problems), problems
    assert len(problems) == 1, problems


def test_managed_by_names_another_controller_and_never_changes():
    from rljob_operator.handlers import managed_here

    assert job_with().spec.managed_here
    assert job_with(managedBy="rljob.dev/operator").spec.managed_here
    other = job_with(managedBy="kueue.x-k8s.io/multikueue")
    assert not other.spec.managed_here
    assert managed_here({}) and managed_here(None)
    assert managed_here({"managedBy": "rljob.dev/operator"})
    assert not managed_here({"managedBy": "kueue.x-k8s.io/multikueue"})
    doc = minimal("mb")
    doc["spec"]["managedBy"] = "multikueue"
    assert any("spec.managedBy" in p.text for p in check_document(doc))
    # immutable, before and after the job starts
    assert [r.message for r in transition_failures(job_with(), other)] == [
        "spec.managedBy is immutable: delete the job and create it with the other "
        "controller's name"]
    assert transition_failures(other, other) == []
