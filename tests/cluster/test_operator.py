"""The operator on a real kube-apiserver + etcd + kube-controller-manager:
installed with Helm, running under the chart's ServiceAccount, driven with
kubectl as the README's cluster journey does."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path

import pytest
import yaml

from rljob.api.validation import load_rljob
from rljob.api import builders as b
from rljob_operator.autoscaler import predicted_change
from tests.cluster.operator_harness import (
    OPERATOR_NS,
    RELEASE,
    CHART,
    OperatorProcess,
    ScriptedStats,
    children,
    get_json,
    helm,
    mark_ready,
    service_account_kubeconfig,
    wait_for,
)
from tests.cases import EXAMPLES, REPO



@pytest.fixture(scope="module")
def installed(crd_installed):
    cluster = crd_installed
    out = helm(cluster, "install", RELEASE, str(CHART), "--namespace", OPERATOR_NS,
               "--create-namespace").stdout
    assert "STATUS: deployed" in out
    yield cluster
    helm(cluster, "uninstall", RELEASE, "--namespace", OPERATOR_NS, check=False)


@pytest.fixture(scope="module")
def operator(installed, tmp_path_factory):
    cluster = installed
    tmp = tmp_path_factory.mktemp("operator")
    kubeconfig = service_account_kubeconfig(cluster, tmp / "kubeconfig")
    op = OperatorProcess(kubeconfig, tmp / "operator.log").start()
    yield op
    op.stop()


@pytest.fixture
def ns(installed):
    with installed.namespace("op") as name:
        yield name


def expected_children(path: Path, ns: str) -> set[tuple[str, str]]:
    job = load_rljob(str(path))
    job.metadata.namespace = ns
    return {(o["kind"], o["metadata"]["name"]) for o in b.build_all(job, "x")
            if o["kind"] != "PodGroup"}


def conditions(cluster, ns, name) -> dict[str, str]:
    st = get_json(cluster, "-n", ns, "get", "rljob", name).get("status") or {}
    return {c["type"]: c["status"] for c in st.get("conditions", [])}


def test_helm_install_creates_the_operators_objects(installed):
    cluster = installed
    objs = get_json(cluster, "-n", OPERATOR_NS, "get",
                    "serviceaccounts,deployments.apps,services", "-l",
                    f"app.kubernetes.io/instance={RELEASE}")["items"]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert {("ServiceAccount", RELEASE), ("Deployment", RELEASE),
            ("Service", f"{RELEASE}-metrics")} <= kinds
    dep = next(o for o in objs if o["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"
    roles = get_json(cluster, "get", "clusterroles", "-l",
                     f"app.kubernetes.io/instance={RELEASE}")["items"]
    assert {r["metadata"]["name"] for r in roles} == {
        RELEASE, f"{RELEASE}-discovery", f"{RELEASE}-edit", f"{RELEASE}-view"}

    # the users' roles are aggregated into Kubernetes' own edit and view roles
    def grants(role: str, verb: str) -> bool:
        rules = get_json(cluster, "get", "clusterrole", role)["rules"]
        return any("rljob.dev" in r.get("apiGroups", []) and "rljobs" in r.get("resources", [])
                   and verb in r.get("verbs", []) for r in rules)

    wait_for(lambda: grants("edit", "create") and grants("view", "list"), 60,
             what="RLJob rules aggregated into the edit and view ClusterRoles")
    assert not grants("view", "create")
    # least privilege: the operator cannot read secrets cluster-wide by listing others' data
    can = cluster.kubectl("auth", "can-i", "delete", "nodes",
                          f"--as=system:serviceaccount:{OPERATOR_NS}:{RELEASE}", check=False)
    assert can.stdout.strip() == "no"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_apply_creates_exactly_the_expected_children(operator, installed, ns, path):
    cluster = installed
    cluster.kubectl("-n", ns, "apply", "-f", str(path))
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    want = expected_children(path, ns)
    wait_for(lambda: children(cluster, ns, name) == want, 30, what=f"children of {name}")
    uid = get_json(cluster, "-n", ns, "get", "rljob", name)["metadata"]["uid"]
    for kind, child in want:
        obj = get_json(cluster, "-n", ns, "get", kind.lower(), child)
        refs = obj["metadata"]["ownerReferences"]
        assert refs[0]["uid"] == uid and refs[0]["controller"] is True
    st = get_json(cluster, "-n", ns, "get", "rljob", name)["status"]
    assert st["observedGeneration"] == 1 and st["startTime"]
    assert st["rollout"]["selector"] == f"rljob.dev/name={name},rljob.dev/role=rollout"


def test_journey_ready_restart_no_duplicates_gang_restart_delete(operator, installed, ns):
    cluster = installed
    path = REPO / "examples" / "quickstart.yaml"
    cluster.kubectl("-n", ns, "apply", "-f", str(path))
    want = expected_children(path, ns)
    wait_for(lambda: children(cluster, ns, "quickstart") == want, 30, what="children")
    secret = get_json(cluster, "-n", ns, "get", "secret", "quickstart-tq-auth")["data"]
    # the job's credentials: the Redis password, the token, and (transferQueue.tls) the
    # job's CA and the certificate it signed for the job's servers
    assert set(secret) == {"password", "token", "ca.crt", "tls.crt", "tls.key"}, set(secret)
    from cryptography import x509

    ca, cert = (x509.load_pem_x509_certificate(base64.b64decode(secret[k]))
                for k in ("ca.crt", "tls.crt"))
    cert.verify_directly_issued_by(ca)

    # the controller-manager made the Deployment's and StatefulSet's pods; mark
    # every pod ready as kubelets would, and the conditions follow
    def pods():
        return get_json(cluster, "-n", ns, "get", "pods", "-l",
                        "rljob.dev/name=quickstart")["items"]
    own_pods = sum(1 for kind, _ in want if kind == "Pod")
    # + the TransferQueue Deployment's pod + one Redis pod per storage unit
    wait_for(lambda: len(pods()) == own_pods + 1 + 1, 30, what="controller pods")
    assert conditions(cluster, ns, "quickstart")["Ready"] == "False"
    for p in pods():
        mark_ready(cluster, ns, p["metadata"]["name"])
    wait_for(lambda: conditions(cluster, ns, "quickstart").get("Ready") == "True", 20,
             what="Ready=True")
    conds = conditions(cluster, ns, "quickstart")
    assert conds["TransferQueueReady"] == conds["TrainerReady"] == conds["RolloutReady"] == "True"
    out = cluster.kubectl("-n", ns, "get", "rljobs").stdout
    assert re.search(r"quickstart\s+True\s+", out), out
    # kopf posts events from a queue of its own, after the status patch that set Ready
    wait_for(lambda: all(reason in cluster.kubectl(
        "-n", ns, "get", "events", "--field-selector", "involvedObject.kind=RLJob").stdout
        for reason in ("Started", "ReadyTrue")), 20, what="the Started and ReadyTrue events")

    # a rollout pod turning unready below minReplicas flips RolloutReady and Ready
    mark_ready(cluster, ns, "quickstart-rollout-0", ready=False)
    mark_ready(cluster, ns, "quickstart-rollout-1", ready=False)
    wait_for(lambda: conditions(cluster, ns, "quickstart").get("RolloutReady") == "False", 20,
             what="RolloutReady=False")
    assert conditions(cluster, ns, "quickstart")["Ready"] == "False"

    # restarting the operator creates no duplicates and keeps the generated password
    before = {(p["metadata"]["name"], p["metadata"]["uid"]) for p in pods()}
    operator.stop()
    operator.start()
    wait_for(lambda: operator.metrics().count('rljob_operator_reconciles_total{trigger="timer"}')
             and 'trigger="resume"' in operator.metrics(), 20, what="reconciles after restart")
    wait_for(lambda: 'rljob_operator_reconciles_total{trigger="timer"} 3' in operator.metrics()
             or _timer_count(operator) >= 3, 20, what="three timer reconciles")
    assert {(p["metadata"]["name"], p["metadata"]["uid"]) for p in pods()} == before
    assert children(cluster, ns, "quickstart") == want
    assert get_json(cluster, "-n", ns, "get", "secret", "quickstart-tq-auth")["data"] == secret

    # a trainer rank fails: the whole gang restarts, resuming from its checkpoint
    mark_ready(cluster, ns, "quickstart-trainer-0", ready=False, phase="Failed")
    def restarted():
        p = [x for x in pods() if x["metadata"]["name"] == "quickstart-trainer-0"]
        return p and p[0]["metadata"]["annotations"].get(b.ANNOTATION_GANG_RESTART) == "1" and p[0]
    pod = wait_for(restarted, 30, what="restarted trainer pod")
    assert "--resume" in pod["spec"]["containers"][0]["command"]
    st = get_json(cluster, "-n", ns, "get", "rljob", "quickstart")["status"]
    assert st["trainer"]["restarts"] == 1
    wait_for(lambda: "TrainerGangRestart" in cluster.kubectl(
        "-n", ns, "get", "events", "--field-selector", "involvedObject.kind=RLJob").stdout,
        20, what="the TrainerGangRestart event")  # posted after the status patch

    # deleting the RLJob removes every child (owner references + garbage collection)
    cluster.kubectl("-n", ns, "delete", "rljob", "quickstart", "--wait=true", "--timeout=60s")
    wait_for(lambda: not children(cluster, ns, "quickstart") and not pods(), 60,
             what="children garbage-collected")


def test_a_job_another_controller_manages_is_left_to_it(operator, installed, ns):
    """spec.managedBy names another controller (MultiKueue's): the operator creates
    nothing for the job and writes nothing to it, not even kopf's bookkeeping."""
    cluster = installed
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["metadata"]["name"] = "elsewhere"
    doc["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(doc))
    # a job of its own, created after it: once that one has its children and the
    # operator's timer has run twice more, the other one had its turns
    path = REPO / "examples" / "quickstart.yaml"
    cluster.kubectl("-n", ns, "apply", "-f", str(path))
    want = expected_children(path, ns)
    wait_for(lambda: children(cluster, ns, "quickstart") == want, 30, what="children")
    ticks = _timer_count(operator)
    wait_for(lambda: _timer_count(operator) >= ticks + 2, 30, what="two timer reconciles")
    assert children(cluster, ns, "elsewhere") == set()
    job = get_json(cluster, "-n", ns, "get", "rljob", "elsewhere")
    assert "status" not in job
    assert not job["metadata"].get("finalizers")
    assert not [k for k in job["metadata"].get("annotations", {}) if k.startswith("rljob.dev")]
    events = cluster.kubectl("-n", ns, "get", "events", "--field-selector",
                             "involvedObject.name=elsewhere").stdout
    assert "elsewhere" not in events


def own_lines(log: str) -> str:
    """The operator's log without urllib3's warnings about the test's self-signed CA."""
    return "\n".join(line for line in log.splitlines()
                     if "InsecureRequestWarning" not in line and "warnings.warn" not in line)


def _timer_count(op: OperatorProcess) -> float:
    m = re.search(r'rljob_operator_reconciles_total\{trigger="timer"\} ([0-9.e+]+)', op.metrics())
    return float(m.group(1)) if m else 0.0


def test_autoscaler_scales_out_when_the_gap_pays(operator, installed, ns, tmp_path):
    """δ′ from an offline profile of the job (`rljob profile`, in a ConfigMap); each
    scale's prediction checked against the Tgen the steps after it report, and the
    error raising the bar of the next decision."""
    import subprocess
    import sys
    import time

    from rljob.planner.profile import Profile

    cluster = installed
    job = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    job["metadata"]["name"] = "elastic"
    rollout = job["spec"].setdefault("rollout", {})
    rollout.update({"replicas": 1, "minReplicas": 1, "maxReplicas": 3, "autoscaling": {
        "enabled": True, "consecutiveSteps": 2, "cooldownSeconds": 10, "intervalSeconds": 1,
        "profileConfigMap": "elastic-profile"}})
    spec = load_rljob_from_dict(job).spec
    measured = subprocess.run([sys.executable, "-m", "rljob", "profile",
                               str(REPO / "examples" / "quickstart.yaml"), "-o",
                               str(tmp_path / "profile.json")],
                              capture_output=True, text=True, timeout=300)
    assert measured.returncode == 0, measured.stderr
    profile, notes = Profile.load(tmp_path / "profile.json").fit(spec, time.time())
    assert profile is not None and notes == []
    cluster.kubectl("-n", ns, "create", "configmap", "elastic-profile",
                    f"--from-file=profile.json={tmp_path / 'profile.json'}")

    # the scripted controller speaks plain text: the job's TLS off (the operator reads a
    # real controller over TLS in the node tier's jobs)
    job["spec"].setdefault("transferQueue", {})["tls"] = False
    with ScriptedStats() as stats:
        job["metadata"]["annotations"] = {"rljob.dev/transferqueue-address": stats.address}
        cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(job))

        def rljob():
            return get_json(cluster, "-n", ns, "get", "rljob", "elastic")

        def observed(step):
            stats_calls = stats.calls
            wait_for(lambda: (rljob().get("status") or {}).get("progress", {}).get("step") == step
                     and stats.calls >= stats_calls + 2, 20, what=f"progress step {step}")

        def rollouts():
            return sorted(p["metadata"]["name"] for p in get_json(
                cluster, "-n", ns, "get", "pods", "-l",
                "rljob.dev/name=elastic,rljob.dev/role=rollout")["items"])

        wait_for(lambda: rollouts() == ["elastic-rollout-0"], 30, what="first rollout pod")
        tgen = 10.0
        gain1, _ = predicted_change(spec, 1, tgen, profile)
        assert gain1 > 0
        below, above = tgen - gain1 + 0.3, tgen - gain1 - 0.3  # Ttrain: δ just under / over δ′

        step = 0

        def feed(ttrain, times=1, observe=True, gen=None):
            """The next `times` steps report (gen or tgen, ttrain); wait until each is seen."""
            nonlocal step
            for _ in range(times):
                step += 1
                stats.set(step, gen or tgen, ttrain)
                if observe:
                    observed(step)

        # δ < δ′ for many steps: nothing happens
        feed(below, 3)
        assert rljob()["spec"]["rollout"]["replicas"] == 1
        # δ ≥ δ′ once, then under again: the streak breaks
        feed(above)
        feed(below)
        assert rljob()["spec"]["rollout"]["replicas"] == 1
        # δ ≥ δ′ for consecutiveSteps (2) steps: exactly one replica more
        feed(above)
        assert rljob()["spec"]["rollout"]["replicas"] == 1
        feed(above, observe=False)
        wait_for(lambda: rljob()["spec"]["rollout"]["replicas"] == 2, 20, what="scale to 2")
        wait_for(lambda: rollouts() == ["elastic-rollout-0", "elastic-rollout-1"], 20,
                 what="second rollout pod")
        last = rljob()["status"]["lastScale"]
        assert (last["from"], last["to"]) == (1, 2)
        assert last["delta"] == pytest.approx(gain1 + 0.3, abs=1e-3)
        assert last["gain"] == pytest.approx(gain1, abs=1e-3)
        assert last["source"] == "offline profile"
        assert last["predictedGenSeconds"] == pytest.approx(tgen - gain1, abs=1e-3)
        conditions = {c["type"]: c for c in rljob()["status"]["conditions"]}
        assert conditions["Scaling"]["status"] == "True"
        assert (conditions["ProfileTrusted"]["status"],
                conditions["ProfileTrusted"]["reason"]) == ("True", "Trusted")
        # the check counts the steps generated with both replicas Ready
        for pod in rollouts():
            mark_ready(cluster, ns, pod)
        wait_for(lambda: (rljob()["status"].get("rollout") or {}).get("readyReplicas") == 2,
                 20, what="both rollout replicas Ready in the status")
        # at 2 replicas the job generates 10 % slower than predicted (balanced, inside
        # the cooldown): the step in progress at the scale is left out, the next two
        # are the check
        tgen2 = (tgen - gain1) * 1.1
        feed(tgen2, 3, gen=tgen2)
        wait_for(lambda: "predictionError" in rljob()["status"]["lastScale"], 20,
                 what="the scale's prediction checked")
        last = rljob()["status"]["lastScale"]
        print(f"scale 1 → 2: δ′ {gain1:.2f} s ({last['source']}); Tgen predicted "
              f"{last['predictedGenSeconds']:.2f} s, measured {last['measuredGenSeconds']:.2f}"
              f" s over {last['checkedSteps']} steps: error {last['predictionError']:+.1%}")
        assert last["predictionError"] == pytest.approx(0.1, abs=1e-3)
        assert last["checkedSteps"] == 2 and rljob()["spec"]["rollout"]["replicas"] == 2
        assert re.search(rf'rljob_job_scale_prediction_error{{namespace="{ns}",'
                         r'rljob="elastic"} 0\.1', operator.metrics())
        # the next decision asks for a gap 10 % above δ′: one just over δ′ does not scale
        gain2, _ = predicted_change(spec, 2, tgen2, profile)
        assert gain2 > 0, f"the measured profile says a third replica saves nothing: {profile.gen}"
        wait_until_cooldown_passed(rljob)
        feed(tgen2 - gain2 * 1.05, 3, gen=tgen2)  # above δ′, under δ′ × 1.1
        assert rljob()["spec"]["rollout"]["replicas"] == 2
        above2 = tgen2 - gain2 * 1.1 - 0.3
        feed(above2, 2, gen=tgen2)
        # two observations closer than intervalSeconds (1 s) count once: on a loaded
        # machine the operator may see both steps in one second, so the gap goes on
        # (a step every 1.1 s) until the streak is whole
        deadline = time.monotonic() + 60
        while rljob()["spec"]["rollout"]["replicas"] != 3:
            if time.monotonic() > deadline:
                obj = rljob()
                events = cluster.kubectl("-n", ns, "get", "events", "--field-selector",
                                         "involvedObject.kind=RLJob").stdout
                pytest.fail(f"no scale to 3 after step {step} (gap {tgen2 - above2:.2f} s, "
                            f"δ′ {gain2:.2f} s × 1.1): lastScale {obj['status'].get('lastScale')}"
                            f"\nconditions {obj['status'].get('conditions')}\nevents:\n"
                            f"{events[-2000:]}\noperator:\n{own_lines(operator.log_tail(400))[-3000:]}")
            time.sleep(1.1)
            feed(above2, 1, gen=tgen2)
        assert rljob()["status"]["lastScale"]["source"] == "offline profile"
        wait_until_cooldown_passed(rljob)
        feed(1.0, 3)  # a huge gap, but maxReplicas is 3
        assert rljob()["spec"]["rollout"]["replicas"] == 3
        wait_for(lambda: len(rollouts()) == 3, 20, what="three rollout pods")

        out = cluster.kubectl("-n", ns, "get", "rljobs", "-o", "wide").stdout
        header, row = out.strip().splitlines()[:2]
        cols = dict(zip(header.split(), row.split()))
        assert cols["ROLLOUTS"] == "3" and cols["STEP"] == str(step)
        assert cols["TOKENS/S"] == "1000" and cols["STALENESS"] == "0.5"
        def events():
            return cluster.kubectl("-n", ns, "get", "events", "--field-selector",
                                   "involvedObject.kind=RLJob").stdout
        # kopf posts events from a queue of its own, after the patches they tell of
        wait_for(lambda: (seen := events()).count("ScaledRolloutOut") == 2
                 and "ScalePredictionChecked" in seen, 20,
                 what="two ScaledRolloutOut events and a ScalePredictionChecked one")
        metrics = operator.metrics()
        assert 'rljob_operator_scale_decisions_total{direction="out"}' in metrics
        assert re.search(rf'rljob_job_rollout_replicas{{namespace="{ns}",rljob="elastic"}} 3',
                         metrics)


def wait_until_cooldown_passed(rljob) -> None:
    import time
    from datetime import datetime

    obj = rljob()
    last = datetime.fromisoformat(obj["status"]["lastScale"]["time"].replace("Z", "+00:00"))
    cooldown = obj["spec"]["rollout"]["autoscaling"]["cooldownSeconds"]
    time.sleep(max(0.0, last.timestamp() + cooldown + 1.0 - time.time()))


def load_rljob_from_dict(doc: dict):
    from rljob.api import RLJob
    return RLJob.model_validate(json.loads(json.dumps(doc)))
