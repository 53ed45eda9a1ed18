"""The operator's pure reconcile plan and autoscaler, without a cluster."""

from __future__ import annotations

import json

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from rljob.api.validation import load_rljob
from rljob.api import builders as b
from rljob_operator.autoscaler import Memory, observe, predicted_change
from rljob_operator.reconcile import choose_rollouts_to_remove, plan

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def job(**kw):
    j = load_rljob(str(REPO / "examples/quickstart.yaml"))
    j.metadata.namespace = "default"
    j.spec.rollout.replicas = kw.get("replicas", 2)
    j.spec.trainer.num_nodes = kw.get("nodes", 2)
    j.spec.run_policy.backoff_limit = kw.get("backoff", 1)
    return j


def pod(obj, phase="Running", ready=True, deleting=False):
    p = {"metadata": dict(obj["metadata"]), "status": {
        "phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return p


def everything_ready(j, restarts=0):
    pods = [pod(b.build_trainer_pod(j, r, restarts)) for r in range(j.spec.trainer.num_nodes)]
    pods += [pod(b.build_rollout_pod(j, i)) for i in range(j.spec.rollout.replicas)]
    pods.append({"metadata": {"name": "x-tq-abc", "labels": b.labels("quickstart", "transferqueue")},
                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    pods.append({"metadata": {"name": "quickstart-redis-0", "labels": b.labels("quickstart", "storage")},
                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    return pods


def conds(p):
    return {c["type"]: c for c in p.status["conditions"]}


def test_a_trainer_pod_deleted_after_progress_resumes_from_its_checkpoint():
    j = job()
    j.spec.trainer.num_nodes = 1
    first = plan(j, {}, [], T0, 1)
    trainer = next(o for o in first.create if o["metadata"]["labels"]["rljob.dev/role"] == "trainer")
    assert "--resume" not in trainer["spec"]["containers"][0]["command"]
    pods = [p for p in everything_ready(j) if p["metadata"]["labels"]["rljob.dev/role"] != "trainer"]
    status = {"startTime": "2026-01-01T00:00:00Z", "progress": {"step": 34}}
    again = plan(j, status, pods, T0, 1)
    [trainer] = [o for o in again.create if o["metadata"]["labels"]["rljob.dev/role"] == "trainer"]
    assert "--resume" in trainer["spec"]["containers"][0]["command"]


def test_fresh_job_creates_every_pod_and_waits():
    j = job()
    p = plan(j, {}, [], T0, 1)
    assert sorted(o["metadata"]["name"] for o in p.create) == [
        "quickstart-rollout-0", "quickstart-rollout-1",
        "quickstart-trainer-0", "quickstart-trainer-1"]
    c = conds(p)
    assert c["Ready"]["status"] == "False" and "TrainerReady" in c["Ready"]["message"]
    assert p.status["startTime"] == "2026-01-01T00:00:00Z"
    assert p.status["observedGeneration"] == 1
    assert p.status["rollout"] == {"replicas": 2, "readyReplicas": 0,
                                   "selector": "rljob.dev/name=quickstart,rljob.dev/role=rollout"}
    assert [e.reason for e in p.events] == ["Started"]


def test_all_ready_sets_ready_and_keeps_transition_times():
    j = job()
    first = plan(j, {}, everything_ready(j), T0, 1)
    assert first.create == [] and first.delete == []
    assert all(conds(first)[t]["status"] == "True"
               for t in ("Ready", "TransferQueueReady", "TrainerReady", "RolloutReady"))
    later = plan(j, first.status, everything_ready(j), T0 + timedelta(minutes=5), 1)
    assert conds(later)["Ready"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert later.events == []
    # a rollout replica turning unready flips RolloutReady only below minReplicas
    pods = everything_ready(j)
    pods[2]["status"]["conditions"][0]["status"] = "False"
    j.spec.rollout.min_replicas = 2
    p = plan(j, later.status, pods, T0 + timedelta(minutes=6), 1)
    assert conds(p)["RolloutReady"]["status"] == "False"
    assert conds(p)["RolloutReady"]["lastTransitionTime"] == "2026-01-01T00:06:00Z"
    assert "RolloutReadyFalse" in [e.reason for e in p.events]


def test_scale_out_and_in_pick_replicas():
    j = job(replicas=2)
    st = plan(j, {}, everything_ready(j), T0, 1).status
    j.spec.rollout.replicas = 3
    p = plan(j, st, everything_ready(job(replicas=2)), T0, 2)
    assert [o["metadata"]["name"] for o in p.create] == ["quickstart-rollout-2"]
    assert p.status["lastScale"]["from"] == 2 and p.status["lastScale"]["to"] == 3
    assert conds(p)["Scaling"]["status"] == "True"
    assert conds(p)["Scaling"]["reason"] == "ScalingOut"
    # scale in from 3 to 1: the busy replica stays, then the lowest index
    pods = everything_ready(job(replicas=3))
    j.spec.rollout.replicas = 1
    busy = {"quickstart-rollout-0": 0, "quickstart-rollout-1": 16, "quickstart-rollout-2": 0}
    p = plan(j, p.status, pods, T0, 3, busy)
    assert sorted(p.delete) == ["quickstart-rollout-0", "quickstart-rollout-2"]


def test_choose_prefers_unready_then_idle_then_highest_index():
    j = job(replicas=4)
    pods = [pod(b.build_rollout_pod(j, i)) for i in range(4)]
    pods[1]["status"]["conditions"][0]["status"] = "False"
    busy = {"quickstart-rollout-3": 5}
    names = [p["metadata"]["name"] for p in choose_rollouts_to_remove(pods, 3, busy)]
    assert names == ["quickstart-rollout-1", "quickstart-rollout-2", "quickstart-rollout-0"]


def test_trainer_failure_restarts_the_whole_gang_then_fails_past_backoff():
    j = job(nodes=2, backoff=1)
    pods = everything_ready(j)
    pods[1]["status"]["phase"] = "Failed"  # rank 1 died
    p = plan(j, {}, pods, T0, 1)
    assert sorted(p.delete) == ["quickstart-trainer-0", "quickstart-trainer-1"]
    assert p.status["trainer"]["restarts"] == 1
    assert "TrainerGangRestart" in [e.reason for e in p.events]
    # while the old pods terminate nothing is created under their names
    terminating = [pod(b.build_trainer_pod(j, r), deleting=True) for r in range(2)]
    p2 = plan(j, p.status, terminating, T0, 1)
    assert not [o for o in p2.create if o["metadata"]["labels"]["rljob.dev/role"] == "trainer"]
    # once gone, the gang comes back resuming from its checkpoint
    p3 = plan(j, p2.status, [], T0, 1)
    trainers = [o for o in p3.create if o["metadata"]["labels"]["rljob.dev/role"] == "trainer"]
    assert len(trainers) == 2
    assert all("--resume" in o["spec"]["containers"][0]["command"] for o in trainers)
    # the restarted gang fails again: backoffLimit 1 is used up
    pods = everything_ready(j, restarts=1)
    pods[0]["status"]["phase"] = "Failed"
    p4 = plan(j, p3.status, pods, T0, 1)
    c = conds(p4)
    assert c["Failed"]["status"] == "True" and c["Failed"]["reason"] == "BackoffLimitExceeded"
    assert p4.status["completionTime"] and p4.finished
    assert "quickstart-rollout-0" in p4.delete and c["Ready"]["status"] == "False"


def test_preflight_problems_fail_the_job_at_once_and_a_crash_of_it_does_not():
    """Rank 0's init container exits 3 with the job's problems as its termination
    message: the job fails with them (no gang restart: a restart would fail the same
    way). Any other exit of it is an ordinary trainer failure."""
    j = job(nodes=2, backoff=3)
    pods = everything_ready(j)
    rank0 = pods[0]
    rank0["status"]["phase"] = "Failed"
    rank0["status"]["initContainerStatuses"] = [{"name": "preflight", "state": {"terminated": {
        "exitCode": 3, "reason": "Error",
        "message": "dataset.promptKey: rows have no key 'q'\nreward.name: cannot import 'x'\n"}}}]
    p = plan(j, {}, pods, T0, 1)
    c = conds(p)
    assert c["Failed"]["status"] == "True" and c["Failed"]["reason"] == "PreflightFailed"
    assert c["Failed"]["message"] == ("dataset.promptKey: rows have no key 'q' · "
                                      "reward.name: cannot import 'x'")
    assert p.finished and p.status["trainer"]["restarts"] == 0
    [event] = [e for e in p.events if e.reason == "PreflightFailed"]
    assert event.type == "Warning" and "dataset.promptKey" in event.message
    # killed for memory (137): a failure of the pod, restarted like any other
    rank0["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] = 137
    p = plan(j, {}, pods, T0, 1)
    assert "Failed" not in conds(p) and p.status["trainer"]["restarts"] == 1


def test_success_deadline_suspend_and_ttl():
    j = job(nodes=1)
    pods = everything_ready(j)
    pods[0]["status"]["phase"] = "Succeeded"
    p = plan(j, {}, pods, T0, 1)
    assert conds(p)["Succeeded"]["status"] == "True"
    assert sorted(p.delete) == ["quickstart-rollout-0", "quickstart-rollout-1"]
    j.spec.run_policy.ttl_seconds_after_finished = 60
    assert not plan(j, p.status, pods, T0 + timedelta(seconds=30), 1).cleanup
    assert plan(j, p.status, pods, T0 + timedelta(seconds=60), 1).cleanup

    j = job(nodes=1)
    j.spec.run_policy.active_deadline_seconds = 100
    st = plan(j, {}, everything_ready(j), T0, 1).status
    p = plan(j, st, everything_ready(j), T0 + timedelta(seconds=101), 1)
    assert conds(p)["Failed"]["reason"] == "DeadlineExceeded"

    j = job()
    st = plan(j, {}, everything_ready(j), T0, 1).status
    j.spec.suspend = True
    p = plan(j, st, everything_ready(j), T0, 2)
    assert sorted(p.delete) == ["quickstart-rollout-0", "quickstart-rollout-1",
                                "quickstart-trainer-0", "quickstart-trainer-1"]
    assert conds(p)["Suspended"]["status"] == "True" and conds(p)["Ready"]["status"] == "False"
    j.spec.suspend = False
    p = plan(j, p.status, everything_ready(j)[4:], T0, 3)
    assert len(p.create) == 4 and conds(p)["Suspended"]["status"] == "False"


# ---- autoscaler ---------------------------------------------------------------

def auto_job(**kw):
    j = job(replicas=kw.get("replicas", 2))
    a = j.spec.rollout.autoscaling
    a.enabled = True
    a.consecutive_steps = kw.get("steps", 2)
    a.cooldown_seconds = kw.get("cooldown", 100)
    a.allow_scale_in = kw.get("scale_in", False)
    a.interval_seconds = kw.get("interval", 1)
    j.spec.rollout.max_replicas = kw.get("max", 4)
    return j.spec


def test_predicted_change_is_positive_and_linear_fallback():
    spec = auto_job()
    gain, loss = predicted_change(spec, 2, 10.0)
    assert 0 < gain < 10 and loss > 0
    spec.model.path = "no-such-model-anywhere"
    assert predicted_change(spec, 2, 9.0) == pytest.approx((3.0, 9.0))


def test_scales_out_after_consecutive_steps_honouring_cooldown_and_max():
    spec = auto_job(steps=2, cooldown=100)
    gain, _ = predicted_change(spec, 2, 10.0)
    mem = Memory()
    big, small = 10.0 - gain - 0.5, 10.0 - gain + 0.5  # Ttrain: gap above / below δ′
    assert observe(mem, spec, 2, 1, 10.0, big, now=0, last_scale_time=None) is None
    assert observe(mem, spec, 2, 1, 10.0, big, now=1, last_scale_time=None) is None  # same step
    assert observe(mem, spec, 2, 2, 10.0, small, now=2, last_scale_time=None) is None  # streak reset
    assert observe(mem, spec, 2, 3, 10.0, big, now=3, last_scale_time=None) is None
    act = observe(mem, spec, 2, 4, 10.0, big, now=4, last_scale_time=None)
    assert act is not None and (act.replicas_from, act.replicas_to) == (2, 3)
    assert act.decision.gap == pytest.approx(gain + 0.5) and act.decision.gain == pytest.approx(gain)
    # in cooldown: the streak completes but nothing happens until it passes
    gain3, _ = predicted_change(spec, 3, 10.0)
    t3 = 10.0 - gain3 - 0.5
    assert observe(mem, spec, 3, 5, 10.0, t3, now=50, last_scale_time=4) is None
    assert observe(mem, spec, 3, 6, 10.0, t3, now=60, last_scale_time=4) is None
    act = observe(mem, spec, 3, 7, 10.0, t3, now=105, last_scale_time=4)
    assert act is not None and act.replicas_to == 4
    # at maxReplicas: never more
    for step in range(8, 14):
        assert observe(mem, spec, 4, step, 100.0, 1.0, now=1000 + step, last_scale_time=105) is None


def test_the_gap_is_sampled_at_most_every_interval_seconds():
    spec = auto_job(steps=2, cooldown=0, interval=30)
    gain, _ = predicted_change(spec, 2, 10.0)
    mem = Memory()
    big = 10.0 - gain - 0.5
    assert observe(mem, spec, 2, 1, 10.0, big, now=0, last_scale_time=None) is None
    # new steps inside the interval are not observations
    for step, now in ((2, 10), (3, 29)):
        assert observe(mem, spec, 2, step, 10.0, big, now=now, last_scale_time=None) is None
    act = observe(mem, spec, 2, 4, 10.0, big, now=30, last_scale_time=None)
    assert act is not None and act.replicas_to == 3


def test_scale_in_only_when_allowed():
    spec = auto_job(replicas=3, steps=1, cooldown=0)
    mem = Memory()
    assert observe(mem, spec, 3, 1, 1.0, 50.0, now=0, last_scale_time=None) is None
    spec = auto_job(replicas=3, steps=1, cooldown=0, scale_in=True)
    act = observe(Memory(), spec, 3, 1, 1.0, 50.0, now=0, last_scale_time=None)
    assert act is not None and act.replicas_to == 2


def test_status_progress_is_the_controllers_figures_rounded():
    from rljob.transferqueue.proto import transferqueue_pb2 as pb
    from rljob_operator.stats import PROGRESS, JobStats

    m = pb.JobMetrics(step=7, gen_seconds=1.23456, train_seconds=0.98765, staleness_mean=0.56789,
                      staleness_max=1, tokens_per_second=1234.567, samples_per_second=9.87654,
                      reward_mean=0.123456)
    stats = JobStats(m, {"job-rollout-0": 16})
    assert (stats.step, stats.gen_seconds, stats.busy) == (7, 1.23456, {"job-rollout-0": 16})
    assert stats.progress("T") == {
        "step": 7, "stalenessMean": 0.5679, "stalenessMax": 1, "rewardMean": 0.1235,
        "tokensPerSecond": 1234.6, "samplesPerSecond": 9.877, "genSeconds": 1.235,
        "trainSeconds": 0.988, "lastUpdatedTime": "T"}
    # every figure the controller keeps but its clock, source and the live profile's
    # record (the autoscaler's input) reaches the status
    fields = set(pb.JobMetrics.DESCRIPTOR.fields_by_name) - {"timestamp", "source", "profile"}
    assert {field for _, field, _ in PROGRESS} == fields


def test_a_status_patch_writes_only_what_the_reconcile_changed():
    """A reconcile that read an older copy of the job (progress at step 5, while a
    later one wrote step 7) and changed only a condition must not write step 5 back."""
    from rljob_operator.reconcile import status_patch

    seen = {"progress": {"step": 5}, "conditions": [{"type": "Ready", "status": "False"}],
            "startTime": "T0"}
    computed = {**seen, "conditions": [{"type": "Ready", "status": "True"}]}
    assert status_patch(seen, computed) == {"conditions": computed["conditions"]}
    assert status_patch(seen, {**seen, "progress": {"step": 8}}) == {"progress": {"step": 8}}
    assert status_patch(seen, seen) == {}
    assert status_patch(seen, {"startTime": "T0"}) == {}  # a key not computed stays


def _profile(spec):
    from rljob.planner.profile import measured_on
    from rljob.planner.profile import GenProfile, Profile, TrainProfile

    return Profile(GenProfile([1, 8, 64], [0.010, 0.011, 0.020], 64),
                   TrainProfile([1], [5000.0]), [4, 6, 6, 60], 7.0,
                   meta=measured_on(spec, "offline: rljob profile"))


def test_the_prediction_names_its_source():
    from rljob_operator.autoscaler import prediction

    spec = auto_job()
    assert prediction(spec, 2, 10.0).source == "linear"  # models/ is not beside the operator
    spec.model.path = f"random:{REPO / 'examples/models/tiny-qwen2'}"
    assert prediction(spec, 2, 10.0).source == "analytic"  # its config.json sized
    p = prediction(spec, 2, 10.0, _profile(spec))
    assert p.source == "offline profile" and 0 < p.gain < 10
    spec.model.path = "no-such-model-anywhere"
    assert prediction(spec, 2, 9.0).source == "linear"


def test_a_scale_s_prediction_is_checked_and_its_error_raises_the_next_bar():
    """After a scale out, the steps after the one in progress measure Tgen at the new
    count; their mean against the prediction is the error; the next decision needs a
    gap larger than δ′ by that much."""
    from rljob_operator.autoscaler import check_prediction, prediction

    spec = auto_job(steps=2, cooldown=0)
    prof = _profile(spec)
    mem = Memory()
    gain = prediction(spec, 2, 10.0, prof).gain
    big = 10.0 - gain - 0.5
    assert observe(mem, spec, 2, 1, 10.0, big, now=0, last_scale_time=None, profile=prof) is None
    act = observe(mem, spec, 2, 2, 10.0, big, now=1, last_scale_time=None, profile=prof)
    assert (act.replicas_to, act.source) == (3, "offline profile")
    assert act.predicted_gen_seconds == pytest.approx(10.0 - gain)
    predicted = act.predicted_gen_seconds
    measured = predicted * 1.2
    assert check_prediction(mem, 3, 10.0, 3, 2) is None  # in progress at the scale
    assert check_prediction(mem, 4, measured, 3, 2) is None
    assert check_prediction(mem, 4, measured, 3, 2) is None  # a step counts once
    checked = check_prediction(mem, 5, measured, 3, 2)
    assert checked == {"predictedGenSeconds": round(predicted, 4),
                       "measuredGenSeconds": round(measured, 4),
                       "predictionError": pytest.approx(0.2, abs=1e-4), "checkedSteps": 2}
    assert mem.error == pytest.approx(0.2) and mem.check is None
    # the next bar: δ′ × 1.2; a gap just over δ′ no longer scales
    gain3 = prediction(spec, 3, measured, prof).gain
    for step, ttrain in ((6, measured - gain3 - 0.01), (7, measured - gain3 - 0.01)):
        assert observe(mem, spec, 3, step, measured, ttrain, now=step, last_scale_time=1,
                       profile=prof) is None
    for step in (8, 9):
        act = observe(mem, spec, 3, step, measured, measured - 1.2 * gain3 - 0.01,
                      now=step, last_scale_time=1, profile=prof)
    assert act is not None and act.replicas_to == 4
    # steps at another replica count are not the check's
    act_check = mem.check
    assert act_check is not None and act_check.replicas == 4
    assert check_prediction(mem, 10, 5.0, 3, 2) is None and mem.check.measured == []


def test_a_trusted_or_refused_profile_is_a_condition():
    j = job(replicas=2)
    p = plan(j, {}, everything_ready(j), T0, 3, profile=(False, "ProfileRefused",
                                                           "ConfigMap p: another model"))
    c = conds(p)["ProfileTrusted"]
    assert (c["status"], c["reason"], c["message"]) == ("False", "ProfileRefused",
                                                         "ConfigMap p: another model")
    assert "ProfileTrusted" not in conds(plan(j, {}, everything_ready(j), T0, 3))


def _record(decode_seconds=0.05, steps=(4, 23)):
    call = {"rows": 4, "prompt_tokens": 40, "output_tokens": 160, "steps": 40,
            "prefill_seconds": 0.01, "decode_seconds": decode_seconds}
    return json.dumps({"steps": list(steps), "gen_calls": [call] * 8, "train_tokens": 4000,
                       "train_seconds": 0.8, "response_lengths": [40] * 32,
                       "prompt_tokens": 10.0})


class _ConfigMaps:
    def __init__(self, data=None):
        self.data = data

    def config_map_data(self, ns, name):
        return self.data


def test_the_live_profile_comes_first_and_names_its_steps():
    """δ′ from the job's own pods once its trainer reports a record of its recent
    steps; before that the ConfigMap's profile; a record that does not make a
    profile makes the autoscaler hold (ProfileTrusted False), never the analytic
    model."""
    from rljob_operator.autoscaler import prediction
    from rljob_operator.handlers import JobState, Operator

    j = job(replicas=1)
    j.spec.rollout.autoscaling.enabled = True
    j.spec.rollout.autoscaling.profile_config_map = "prof"
    op = Operator(kube=_ConfigMaps({"profile.json": _profile(j.spec).to_json()}))
    state = JobState()
    assert op._trusted(j, state)[1] == "Trusted"  # no live record yet: the ConfigMap's
    op._live(j, state, "")
    assert op._trusted(j, state)[1] == "Trusted"
    op._live(j, state, _record())
    profile, reason, message = op._trusted(j, state)
    assert (reason, message) == ("LiveProfile", "live profile of steps 4-23, measured by "
                                                "the job's own pods")
    assert profile.gen.ptl_seconds == [pytest.approx(0.05 / 39)]
    p = prediction(j.spec, 1, 10.0, profile)
    assert p.source == "live profile" and 0 < p.gain <= 5.0  # at most half of Tgen
    j.spec.rollout.autoscaling.profile_config_map = None
    op._live(j, state, '{"steps": [4, 5], "gen_calls": []}')
    assert op._trusted(j, state)[:2] == (None, "LiveProfileRefused")
    assert "no engine timings" in op._trusted(j, state)[2]


def test_without_a_profile_the_autoscaler_waits_for_the_live_one_before_the_fallbacks():
    """No ConfigMap and no live record yet: the autoscaler holds while the trainer's
    first record is due (it acts on no analytic or linear estimate with a measured
    one a few steps away), then takes the live profile; a record that never comes
    lets the analytic model act LIVE_PROFILE_GRACE steps after it was due."""
    from rljob.contract import LIVE_PROFILE_SKIP
    from rljob_operator.autoscaler import LIVE_PROFILE_GRACE, awaiting_live_profile
    from rljob_operator.handlers import JobState, Operator

    due = LIVE_PROFILE_SKIP + 1 + LIVE_PROFILE_GRACE
    assert awaiting_live_profile(None, 50)
    assert [awaiting_live_profile(1, s) for s in range(1, due + 2)] == [True] * due + [False]
    assert awaiting_live_profile(40, 40 + due - 1) and not awaiting_live_profile(40, 40 + due)

    j = job(replicas=2)
    j.spec.rollout.autoscaling.enabled = True
    op = Operator(kube=_ConfigMaps())
    state = JobState()
    assert op._trusted(j, state)[:2] == (None, "LiveProfilePending")  # no step seen yet
    state.steps = (1, 3)
    profile, reason, message = op._trusted(j, state)
    assert (profile, reason) == (None, "LiveProfilePending")
    assert f"from its step {LIVE_PROFILE_SKIP + 1} on" in message
    op._live(j, state, _record())
    assert op._trusted(j, state)[1] == "LiveProfile"
    state = JobState(steps=(1, 1 + due))  # due and past the grace, no record: analytic
    assert op._trusted(j, state) is None

    # the operator's reconcile: with no record, a generation-bound gap does not scale
    # while the record is due, however long the gap holds
    class Stats:
        busy, profile, gen_seconds, train_seconds = {}, "", 10.0, 1.0

    scaled = []
    op.kube.patch_status = lambda *a: scaled.append(a)
    op.kube.scale = lambda *a: scaled.append(a)
    j.spec.rollout.max_replicas, j.spec.rollout.autoscaling.interval_seconds = 4, 0
    j.spec.rollout.autoscaling.consecutive_steps = 1
    state = JobState(steps=(1, 1))
    for step in range(1, due):
        Stats.step = step
        state.steps = (1, step)
        op._autoscale({}, j, state, {}, Stats, op._trusted(j, state))
    assert scaled == []


def test_a_prediction_is_checked_on_steps_with_every_replica_ready():
    """A replica still starting up generates nothing: the steps before the scale's
    count is Ready (and the one in progress then, and the next) are not its check."""
    from rljob_operator.autoscaler import Check, check_prediction

    mem = Memory(check=Check(step=3, replicas=2, predicted=4.0))
    for step in (4, 5, 6, 7):  # rollout-1 not Ready yet: Tgen still one replica's
        assert check_prediction(mem, step, 8.0, 2, 2, ready=1) is None
    assert mem.check.measured == []
    assert check_prediction(mem, 8, 5.0, 2, 2, ready=2) is None  # in progress at Ready
    assert check_prediction(mem, 9, 5.0, 2, 2, ready=2) is None  # wholly after it
    checked = check_prediction(mem, 10, 5.0, 2, 2, ready=2)
    assert checked["measuredGenSeconds"] == 5.0 and checked["checkedSteps"] == 2
    assert checked["predictionError"] == pytest.approx(0.25)


def test_a_new_scale_record_removes_the_last_one_s_check():
    """status goes out as a merge patch: a new lastScale names every figure of the
    last one it does not carry, as null, or the last check's would stay beside it."""
    from rljob_operator.reconcile import SCALE_FIGURES, new_scale

    record = new_scale({"time": "T", "from": 2, "to": 3, "reason": "r", "delta": 1.0})
    assert record["delta"] == 1.0 and record["measuredGenSeconds"] is None
    assert set(record) == {"time", "from", "to", "reason", *SCALE_FIGURES}
    j = job(replicas=3)
    p = plan(j, {"rollout": {"replicas": 2}, "lastScale": {
        "time": "T0", "from": 1, "to": 2, "reason": "r", "predictionError": 0.5}},
        everything_ready(j), T0, 3)
    assert p.status["lastScale"]["to"] == 3 and p.status["lastScale"]["predictionError"] is None


def test_a_spec_an_older_crd_let_through_is_refused_with_the_upgrade_in_one_line():
    """The README's promise: the operator refuses specs the installed CRD cannot carry
    (a CRD older than the operator admits what the operator cannot read), saying so
    and naming the field, as a permanent error (no retry loop)."""
    import kopf

    from rljob_operator.handlers import to_job

    body = {"apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob",
            "metadata": {"name": "old", "namespace": "ns", "uid": "u"},
            "spec": {"model": {"path": "m"}, "dataset": {"path": "d.jsonl"},
                     "algorithm": {"groupSize": "eight"}}}
    with pytest.raises(kopf.PermanentError) as err:
        to_job(body)
    message = str(err.value)
    assert message.startswith("spec does not validate (is the installed CRD older than the "
                              "operator? upgrade crds/rljob.yaml)"), message
    assert "groupSize" in message and "Traceback" not in message
    body["spec"]["algorithm"]["groupSize"] = 8
    assert to_job(body).spec.algorithm.group_size == 8


def test_the_clean_up_leaves_a_workloads_pods_to_go_with_it():
    """ttlSecondsAfterFinished deletes owners first and never a pod a ReplicaSet or
    StatefulSet controls: deleted by hand, it would be recreated while its owner
    stands (the garbage collector removes it with the owner)."""
    from rljob_operator.kube import CHILD_KINDS, owned_by_a_workload

    kinds = [k for _, k in CHILD_KINDS]
    assert kinds.index("Deployment") < kinds.index("Pod")
    assert kinds.index("StatefulSet") < kinds.index("Pod")
    assert kinds[-1] == "NetworkPolicy"  # the pods stay behind it while they go

    def pod(*refs):
        return {"metadata": {"name": "p", "ownerReferences": list(refs)}}

    assert owned_by_a_workload(pod({"kind": "ReplicaSet", "name": "x-tq-1", "controller": True}))
    assert owned_by_a_workload(pod({"kind": "StatefulSet", "name": "x-redis", "controller": True}))
    # the operator's own pods (rollouts, trainer ranks): owned by the RLJob, deleted
    assert not owned_by_a_workload(pod({"kind": "RLJob", "name": "x", "controller": True}))
    assert not owned_by_a_workload(pod())
    assert not owned_by_a_workload(pod({"kind": "ReplicaSet", "name": "y"}))  # not its controller


def test_a_rank_whose_pod_went_restarts_the_whole_gang_of_several():
    """Two ranks: rank 1's pod deleted mid-run. Rank 0 is not left running beside a
    lone new rank 1: the gang restarts (every rank from the checkpoint)."""
    j = job(nodes=2, backoff=3)
    status = {"startTime": "2026-01-01T00:00:00Z", "progress": {"step": 12},
              "trainer": {"restarts": 0}}
    pods = everything_ready(j)
    pods[1]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # kubectl delete pod
    assert pods[1]["metadata"]["name"] == "quickstart-trainer-1"
    p = plan(j, status, pods, T0, 1)
    assert p.status["trainer"]["restarts"] == 1
    assert "quickstart-trainer-0" in p.delete
    # the ranks come back once their old pods are gone
    assert not [o for o in p.create if o["metadata"]["labels"]["rljob.dev/role"] == "trainer"]
    # while they terminate, nothing more happens (they are the old gang's)
    old = [pod(b.build_trainer_pod(j, r, 0), deleting=True) for r in range(2)]
    waiting = plan(j, {**status, "trainer": {"restarts": 1}}, old + pods[2:], T0, 1)
    assert waiting.status["trainer"]["restarts"] == 1 and not waiting.create
    [event] = [e for e in p.events if e.reason == "TrainerGangRestart"]
    assert "the pod(s) of trainer rank(s) [1] went" in event.message
    # once the old rank 0 is gone, both ranks come back, resuming
    rest = pods[2:]
    again = plan(j, {**status, "trainer": {"restarts": 1}}, rest, T0, 1)
    made = [o for o in again.create if o["metadata"]["labels"]["rljob.dev/role"] == "trainer"]
    assert sorted(o["metadata"]["name"] for o in made) == ["quickstart-trainer-0",
                                                           "quickstart-trainer-1"]
    assert all("--resume" in o["spec"]["containers"][0]["command"] for o in made)
    assert again.status["trainer"]["restarts"] == 1
    # a gang of one: its pod comes back alone, no restart
    one = job(nodes=1)
    solo = everything_ready(one)
    solo[0]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert plan(one, status, solo, T0, 1).status["trainer"]["restarts"] == 0
    assert plan(one, status, solo[1:], T0, 1).status["trainer"]["restarts"] == 0
