"""reward.url's replicas in the cluster: their pods (built, pure), the reconcile that
keeps their count, their readiness in the job's conditions and status, and their
place in Kueue's pod sets and the capacity a job waits for."""

from __future__ import annotations

from rljob.api import builders as b
from rljob.api.spec import PodTemplateOverride, RewardSpec
from rljob_operator.capacity import job_demand
from rljob_operator.queue import pod_sets
from rljob_operator.reconcile import plan
from tests.unit.test_operator_reconcile import T0, conds, everything_ready, job, pod

URL = {"endpoint": "http://scorer.default.svc:8000/score", "apiKeySecret": "rm-key"}


def scored(replicas=2, **kw):
    j = job(**kw)
    j.spec.reward = RewardSpec(name="arith_partial", url=URL, replicas=replicas,
                               resources={"cpu": "250m", "memory": "256Mi"})
    return j


def roles(objs):
    return [o["metadata"]["labels"]["rljob.dev/role"] for o in objs]


def test_a_reward_pod_runs_the_worker_with_its_key_and_no_accelerator():
    j = scored()
    j.spec.accelerator.type = "ascend"  # the job's devices are not the reward pods'
    j.spec.accelerator.node_selector = {"accelerator": "ascend-910b"}
    j.spec.pod_template_overrides = [PodTemplateOverride.model_validate(
        {"roles": ["reward"], "metadata": {"labels": {"team": "rm"}}})]
    p = b.build_reward_pod(j, 1)
    assert p["metadata"]["name"] == "quickstart-reward-1"
    assert p["metadata"]["labels"]["team"] == "rm"
    c = p["spec"]["containers"][0]
    assert c["command"][:3] == ["rljob", "worker", "reward"] and "--replica" in c["command"]
    assert c["command"][c["command"].index("--replica") + 1] == "1"
    key = next(e for e in c["env"] if e["name"] == "RLJOB_REWARD_API_KEY")
    assert key["valueFrom"]["secretKeyRef"] == {"name": "rm-key", "key": "apiKey"}
    assert c["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"},
                              "limits": {"cpu": "250m", "memory": "256Mi"}}
    assert "nodeSelector" not in p["spec"]
    assert p["spec"]["securityContext"]["runAsNonRoot"] is True
    assert p["spec"]["restartPolicy"] == "Always"
    assert roles(b.build_all(j, "pw")).count("reward") == 2
    assert "reward" not in roles(b.build_all(job(), "pw"))  # the rule alone: none


def test_the_reconcile_keeps_the_reward_replicas_and_ready_waits_for_them():
    j = scored()
    first = plan(j, {}, [], T0, 1)
    assert sorted(o["metadata"]["name"] for o in first.create if roles([o]) == ["reward"]) == \
        ["quickstart-reward-0", "quickstart-reward-1"]
    pods = everything_ready(j)
    waiting = plan(j, {"startTime": "2026-01-01T00:00:00Z"}, pods, T0, 1)
    c = conds(waiting)
    assert c["RewardReady"]["status"] == "False" and c["Ready"]["status"] == "False"
    assert "RewardReady" in c["Ready"]["message"]
    assert waiting.status["reward"] == {"replicas": 2, "readyReplicas": 0}
    pods += [pod(b.build_reward_pod(j, 0)), pod(b.build_reward_pod(j, 1), phase="Failed")]
    again = plan(j, {"startTime": "2026-01-01T00:00:00Z"}, pods, T0, 1)
    assert again.delete == ["quickstart-reward-1"]  # failed: replaced once it is gone
    pods[-1] = pod(b.build_reward_pod(j, 1))
    ready = plan(j, {"startTime": "2026-01-01T00:00:00Z"}, pods, T0, 1)
    assert conds(ready)["Ready"]["status"] == "True" and not ready.create
    j.spec.reward.replicas = 1  # scaled in: the highest index goes
    assert plan(j, {"startTime": "2026-01-01T00:00:00Z"}, pods, T0, 1).delete == \
        ["quickstart-reward-1"]
    j.spec.suspend = True
    suspended = plan(j, {"startTime": "2026-01-01T00:00:00Z"}, pods, T0, 1)
    assert {"quickstart-reward-0", "quickstart-reward-1"} <= set(suspended.delete)
    rule_only = plan(job(), {}, [], T0, 1)
    assert "RewardReady" not in conds(rule_only) and "reward" not in rule_only.status


def test_kueue_and_the_capacity_wait_count_the_reward_replicas():
    j = scored(replicas=3)
    sets = {s["name"]: s for s in pod_sets(j)}
    assert sets["reward"]["count"] == 3
    assert sets["reward"]["template"]["spec"]["containers"][0]["name"] == "reward"
    assert "reward" not in {s["name"] for s in pod_sets(job())}
    demand = [d.role for d in job_demand(j)]
    assert demand.count("reward") == 3
    assert b.build_pod_group(j)["spec"]["minMember"] == \
        j.spec.trainer.num_nodes + j.spec.rollout.min_replicas + 3


def test_a_reward_model_pod_has_its_accelerators_and_its_volume():
    j = job()
    j.spec.accelerator.type = "ascend"
    j.spec.reward = RewardSpec(model={"path": "/reward-models/rm", "pvc": "rm-weights",
                                      "npusPerReplica": 2}, replicas=1)
    p = b.build_reward_pod(j, 0)
    c = p["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"huawei.com/Ascend910": "2"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/reward-models"] == "reward-models" and "/dev/shm" in mounts
    claim = next(v for v in p["spec"]["volumes"] if v["name"] == "reward-models")
    assert claim["persistentVolumeClaim"] == {"claimName": "rm-weights", "readOnly": True}
    assert "/usr/local/Ascend/driver" in mounts  # the accelerator's host paths
    assert "RLJOB_REWARD_API_KEY" not in {e["name"] for e in c["env"]}
    # the rollout and trainer pods do not mount it
    assert all(v["name"] != "reward-models" for v in b.build_rollout_pod(j, 0)["spec"]["volumes"])
