"""The pure builders (rljob.api.builders): RLJob → Kubernetes objects, no cluster."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from rljob.api.spec import WandbSpec
from rljob.api.validation import load_rljob
from rljob.api import builders as b
from rljob.contract import TOKEN_ENV

REPO = Path(__file__).resolve().parents[2]


def load(name: str, **spec_overrides):
    job = load_rljob(str(REPO / "examples" / name))
    job.metadata.namespace = "team-a"
    job.metadata.uid = "1234-uid"
    for path, value in spec_overrides.items():
        obj = job.spec
        *parents, last = path.split(".")
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, last, value)
    return job


def by_kind_name(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def env_of(container) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_quickstart_children_are_named_labelled_and_owned():
    job = load("quickstart.yaml")
    objs = b.build_all(job, "pw")
    names = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert names == [
        ("Secret", "quickstart-tq-auth"), ("ConfigMap", "quickstart-spec"),
        ("Service", "quickstart-redis"), ("StatefulSet", "quickstart-redis"),
        ("Service", "quickstart-tq"), ("Deployment", "quickstart-tq"),
        ("Service", "quickstart-trainer"), ("NetworkPolicy", "quickstart-ingress"),
        ("Pod", "quickstart-trainer-0"),
        *[("Pod", f"quickstart-rollout-{i}") for i in range(job.spec.rollout.replicas)],
    ]
    for o in objs:
        meta = o["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [{
            "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "name": "quickstart",
            "uid": "1234-uid", "controller": True, "blockOwnerDeletion": True}]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "rljob-operator"
        assert meta["labels"]["rljob.dev/name"] == "quickstart"
        assert meta["labels"]["app.kubernetes.io/component"] == meta["labels"]["rljob.dev/role"]
    # deterministic: the same job gives the same objects
    assert b.build_all(job, "pw") == objs


def test_the_network_policy_admits_the_job_its_operator_and_monitoring_only():
    """NAME-ingress selects every pod of the job; it admits the job's own pods on any
    port, the operator's pods (in its namespace) on the controller's port and the
    monitoring namespaces on the metrics ports: nothing else; egress stays open."""
    job = load("quickstart.yaml")
    access = b.NetworkAccess(True, "ops", ("mon-a", "mon-b"))
    objs = b.build_all(job, "pw", access=access)
    policy = by_kind_name(objs)[("NetworkPolicy", "quickstart-ingress")]
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"rljob.dev/name": "quickstart"}}
    assert spec["policyTypes"] == ["Ingress"]
    own, operator, monitoring = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"rljob.dev/name": "quickstart"}}}]}
    assert operator == {"from": [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "rljob-operator"}}}],
        "ports": [{"protocol": "TCP", "port": b.TQ_PORT}]}
    assert monitoring["from"] == [{"namespaceSelector": {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In", "values": ["mon-a", "mon-b"]}]}}]
    assert [p["port"] for p in monitoring["ports"]] == [b.METRICS_PORT, b.DRIVER_METRICS_PORT]
    # every pod of the job is selected: each carries the job's label
    pods = [o for o in objs if o["kind"] in ("Pod", "Deployment", "StatefulSet")]
    for o in pods:
        template = o if o["kind"] == "Pod" else o["spec"]["template"]
        assert template["metadata"]["labels"]["rljob.dev/name"] == "quickstart"
    # an operator outside the cluster, no monitoring: the job's own pods alone
    alone = b.build_network_policy(job, b.NetworkAccess(True, None, ()))
    assert alone["spec"]["ingress"] == [own]
    # off: no policy (a cluster whose plugin enforces none, or a platform's own)
    off = b.build_all(job, "pw", access=b.NetworkAccess(enabled=False))
    assert "NetworkPolicy" not in {o["kind"] for o in off}


def test_every_process_of_the_job_has_its_token_from_its_secret():
    """The job's credentials (infra/auth.py): its Secret holds the password and the
    token; every container that runs rljob reads the token from it, so its servers
    answer only its own processes."""
    job = load("quickstart.yaml")
    objs = b.build_all(job, "pw", token="tk")
    secret = objs[0]
    assert secret["kind"] == "Secret"
    assert secret["stringData"] == {b.PASSWORD_KEY: "pw", b.TOKEN_KEY: "tk"}
    ref = {"secretKeyRef": {"name": secret["metadata"]["name"], "key": b.TOKEN_KEY}}
    containers = []
    for o in objs:
        spec = o["spec"]["template"]["spec"] if "template" in o.get("spec", {}) else o.get("spec", {})
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            if c["name"] != "redis":
                containers.append((o["metadata"]["name"], c))
    assert {c["name"] for _, c in containers} >= {"transferqueue", "driver", "trainer", "rollout"}
    for owner, c in containers:
        assert env_of(c).get(TOKEN_ENV) == ref, (owner, c["name"])


def test_config_map_holds_the_resolved_job_that_validates():
    job = load("quickstart.yaml")
    cm = b.build_config_map(job)
    doc = yaml.safe_load(cm["data"]["job.yaml"])
    assert doc["metadata"] == {"name": "quickstart", "namespace": "team-a"}
    # every default is written out, so workers and humans read one full spec
    assert doc["spec"]["transferQueue"]["leaseSeconds"] == job.spec.transfer_queue.lease_seconds
    assert doc["spec"]["workflow"]["mode"] == job.spec.workflow.mode
    from rljob.api import RLJob
    assert RLJob.model_validate(doc).spec == job.spec


def test_transferqueue_wiring_matches_the_worker_entrypoints():
    job = load("quickstart.yaml")
    job.spec.transfer_queue.storage_units = 3
    sts = b.build_redis_statefulset(job)
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["serviceName"] == "quickstart-redis"
    redis = sts["spec"]["template"]["spec"]["containers"][0]
    # the default user off; the job's ACL user, on the job's keys, with the password
    args = " ".join(redis["args"])
    assert "--requirepass" not in args and "--user default off " in args
    assert "--user rljob on >$(RLJOB_TQ_PASSWORD) resetkeys ~quickstart:* resetchannels -@all " \
        "+ping " in args
    for refused in ("flushall", "flushdb", "config", "debug", "keys", "monitor", "@all"):
        assert f"+{refused}" not in redis["args"]
    assert "--user rljob" in redis["readinessProbe"]["exec"]["command"][-1]
    assert env_of(redis)["REDISCLI_AUTH"]["secretKeyRef"]["key"] == "password"
    assert env_of(ctl := b.build_tq_deployment(job)["spec"]["template"]["spec"]["containers"][0]
                  )["RLJOB_TQ_USER"] == "rljob", ctl["env"]
    assert "volumeClaimTemplates" not in sts["spec"]
    dep = b.build_tq_deployment(job)
    ctl, driver = dep["spec"]["template"]["spec"]["containers"]
    assert ctl["command"] == ["rljob", "worker", "transferqueue"]
    urls = [ctl["args"][i + 1] for i, a in enumerate(ctl["args"]) if a == "--redis"]
    # transferQueue.tls (the default): rediss://, a unit serving TLS alone on the job's
    # certificate from the Secret, probed over TLS; the controller probed on the plain-
    # text port of its health service alone (the kubelet's gRPC probe speaks no TLS)
    assert urls == [f"rediss://quickstart-redis-{i}.quickstart-redis.team-a.svc:6379/0"
                    for i in range(3)]
    assert "--port 0 --tls-port 6379 --tls-cert-file /etc/rljob-tls/tls.crt" in args
    assert "--tls-cacert" not in args and "redis-cli --tls --cacert /etc/rljob-tls/ca.crt" in \
        redis["readinessProbe"]["exec"]["command"][-1]
    tls_volume = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}["tls"]
    assert tls_volume["secret"]["secretName"] == "quickstart-tq-auth"
    assert ctl["readinessProbe"]["grpc"]["port"] == b.HEALTH_PORT
    assert "--health-port" in ctl["args"]
    for env, key in b.TLS_KEYS.items():
        assert env_of(ctl)[env] == {"secretKeyRef": {"name": "quickstart-tq-auth", "key": key}}
    plain = load("quickstart.yaml")  # transferQueue.tls false: none of it
    plain.spec.transfer_queue.tls = False
    sts = b.build_redis_statefulset(plain)
    redis = sts["spec"]["template"]["spec"]["containers"][0]
    assert redis["args"][:2] == ["--port", "6379"] and "--tls-port" not in redis["args"]
    assert "tls" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
    ctl_plain = b.build_tq_deployment(plain)["spec"]["template"]["spec"]["containers"][0]
    assert not set(b.TLS_KEYS) & set(env_of(ctl_plain))
    assert all(u.startswith("redis://") for u in b.redis_urls(plain))
    assert env_of(ctl)["RLJOB_TQ_PASSWORD"] == {"secretKeyRef": {
        "name": "quickstart-tq-auth", "key": "password"}}
    assert driver["command"][:3] == ["rljob", "worker", "driver"]
    assert "quickstart-trainer-0.quickstart-trainer.team-a.svc:50052" in driver["args"]
    # done, it stays: a container that exits is restarted and its pod not Ready
    assert "--stay" in driver["args"]
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod_sec = dep["spec"]["template"]["spec"]["securityContext"]
    assert pod_sec["runAsNonRoot"] is True
    sts = b.build_redis_statefulset(job)
    redis_pod = sts["spec"]["template"]["spec"]
    assert {"name": "data", "emptyDir": {}} in redis_pod["volumes"]
    assert "volumeClaimTemplates" not in sts["spec"]
    args = redis_pod["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"  # a redis restart keeps the table
    # synced before each answer: what a unit acknowledged survives its process's kill
    assert args[args.index("--appendfsync") + 1] == "always"
    job.spec.transfer_queue.redis.persistence = True
    sts = b.build_redis_statefulset(job)
    assert "data" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert "--appendonly" in sts["spec"]["template"]["spec"]["containers"][0]["args"]


def test_trainer_gang_rank_env_and_headless_dns():
    job = load("quickstart.yaml")
    job.spec.trainer.num_nodes = 3
    svc = b.build_trainer_service(job)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    for rank in range(3):
        pod = b.build_trainer_pod(job, rank)
        spec = pod["spec"]
        assert spec["hostname"] == f"quickstart-trainer-{rank}"
        assert spec["subdomain"] == "quickstart-trainer"
        assert spec["restartPolicy"] == "Never"
        env = env_of(spec["containers"][0])
        assert env["MASTER_ADDR"] == "quickstart-trainer-0.quickstart-trainer.team-a.svc"
        assert env["MASTER_PORT"] == "29500"
        assert (env["RANK"], env["NODE_RANK"], env["WORLD_SIZE"], env["NNODES"]) == (
            str(rank), str(rank), "3", "3")
        cmd = spec["containers"][0]["command"]
        assert cmd[:3] == ["rljob", "worker", "trainer"] and "--resume" not in cmd
        assert pod["metadata"]["labels"]["rljob.dev/rank"] == str(rank)
    restarted = b.build_trainer_pod(job, 0, restarts=2)
    assert "--resume" in restarted["spec"]["containers"][0]["command"]
    assert restarted["metadata"]["annotations"][b.ANNOTATION_GANG_RESTART] == "2"


def test_ascend_job_gets_devices_mounts_hccl_and_volcano_gang():
    job = load("grpo-qwen2.5-7b-ascend.yaml")
    objs = by_kind_name(b.build_all(job, "pw"))
    name = job.metadata.name
    pg = objs[("PodGroup", f"{name}-trainer")]
    assert pg["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    # one gang: the trainer ranks and the minimum rollouts, their NPUs together
    r = job.spec.rollout
    assert pg["spec"]["minMember"] == job.spec.trainer.num_nodes + r.min_replicas
    assert pg["spec"]["minResources"] == {"huawei.com/Ascend910": str(
        job.spec.trainer.num_nodes * job.spec.trainer.npus_per_node
        + r.min_replicas * r.npus_per_replica)}
    rollout = objs[("Pod", f"{name}-rollout-0")]
    assert rollout["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == f"{name}-trainer"
    assert rollout["spec"]["schedulerName"] == "volcano"
    assert pg["spec"]["queue"] == job.spec.scheduling.queue
    trainer = objs[("Pod", f"{name}-trainer-0")]
    spec = trainer["spec"]
    assert spec["schedulerName"] == "volcano"
    assert trainer["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == f"{name}-trainer"
    assert spec["nodeSelector"] == job.spec.accelerator.node_selector
    c = spec["containers"][0]
    npus = str(job.spec.trainer.npus_per_node)
    assert c["resources"] == {"requests": {"huawei.com/Ascend910": npus},
                              "limits": {"huawei.com/Ascend910": npus}}
    # eight NPUs per node: torchrun starts one process per NPU
    assert c["command"][0] == "torchrun" and f"--nproc-per-node={npus}" in c["command"]
    assert "--no-python" in c["command"]
    env = env_of(c)
    assert env["HCCL_IF_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["HCCL_SOCKET_IFNAME"] == job.spec.accelerator.hccl.socket_ifname
    assert env["HCCL_CONNECT_TIMEOUT"] == str(job.spec.accelerator.hccl.connect_timeout_seconds)
    assert "RANK" not in env and env["NODE_RANK"] == "0"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/usr/local/Ascend/driver", "/dev/shm", "/etc/rljob"} <= mounts
    assert "/models" in mounts and "/data" in mounts
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert vols["ascend-driver"]["hostPath"]["path"] == "/usr/local/Ascend/driver"
    rollout = objs[("Pod", f"{name}-rollout-1")]
    rc = rollout["spec"]["containers"][0]
    per = str(job.spec.rollout.npus_per_replica)
    assert rc["resources"]["limits"] == {"huawei.com/Ascend910": per}
    assert rc["command"][:3] == ["rljob", "worker", "rollout"]
    assert rc["command"][rc["command"].index("--replica") + 1] == "1"
    assert rollout["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == "default"


def test_cpu_pods_request_no_accelerator_and_run_as_non_root():
    job = load("quickstart.yaml")
    pod = b.build_rollout_pod(job, 0)
    assert pod["spec"]["containers"][0]["resources"] == {}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert "nodeSelector" not in pod["spec"] and "schedulerName" not in pod["spec"]
    assert not any(v.get("hostPath") for v in pod["spec"]["volumes"])
    gpu = copy.deepcopy(job)
    gpu.spec.accelerator.type = "gpu"
    res = b.build_rollout_pod(gpu, 0)["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"nvidia.com/gpu": str(job.spec.rollout.npus_per_replica)}


def test_role_resources_are_requests_and_limits_beside_the_accelerator():
    job = load("scaleout-cluster.yaml")
    res = b.build_rollout_pod(job, 2)["spec"]["containers"][0]["resources"]
    # the CPU limit is what the worker sizes its threads by (device.cores_given)
    assert res == {"requests": {"cpu": "450m", "memory": "2Gi"},
                   "limits": {"cpu": "450m", "memory": "2Gi"}}
    assert b.build_trainer_pod(job, 0)["spec"]["containers"][0]["resources"] == {}
    npu = load("quickstart.yaml", **{"accelerator.type": "ascend"})
    npu.spec.trainer.resources.cpu, npu.spec.trainer.resources.memory = "16", "256Gi"
    res = b.build_trainer_pod(npu, 0)["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"cpu": "16", "memory": "256Gi",
                             "huawei.com/Ascend910": str(npu.spec.trainer.npus_per_node)}
    assert res["requests"] == res["limits"]


def test_checkpoint_pvc_mounts_and_run_dir():
    job = load("quickstart.yaml")
    job.spec.trainer.checkpoint_pvc = "ckpt"
    c = b.build_trainer_pod(job, 0)["spec"]["containers"][0]
    assert c["command"][c["command"].index("--run-dir") + 1] == "/checkpoints/quickstart"
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in c["volumeMounts"]


def test_render_cli_prints_the_builders_objects(tmp_path):
    from typer.testing import CliRunner

    from rljob.cli import app
    from rljob.cli.job import RENDER_PASSWORD

    res = CliRunner().invoke(app, ["render", str(REPO / "examples/quickstart.yaml"),
                                   "-n", "ml"])
    assert res.exit_code == 0, res.output
    docs = list(yaml.safe_load_all(res.output))
    job = load_rljob(str(REPO / "examples/quickstart.yaml"))
    job.metadata.namespace = "ml"
    expected = b.build_all(job, "x")
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        (d["kind"], d["metadata"]["name"]) for d in expected]
    # the same text every time: the Secret holds a fixed placeholder, for the TLS
    # certificates too (transferQueue.tls, on by default)
    placeholders = dict.fromkeys(b.TLS_KEYS, RENDER_PASSWORD)
    assert docs == b.build_all(job, RENDER_PASSWORD, tls=placeholders)
    assert "BEGIN" not in res.output
    again = CliRunner().invoke(app, ["render", str(REPO / "examples/quickstart.yaml"), "-n", "ml"])
    assert again.output == res.output
    # --fresh-secret: a random password, the rest unchanged
    fresh = CliRunner().invoke(app, ["render", str(REPO / "examples/quickstart.yaml"), "-n", "ml",
                                     "--fresh-secret"])
    fresh_docs = list(yaml.safe_load_all(fresh.output))
    assert fresh_docs[1:] == expected[1:]
    assert len(fresh_docs[0]["stringData"]["password"]) >= 24
    assert fresh_docs[0]["stringData"]["password"] != RENDER_PASSWORD
    # and a random job token, apart from the password
    token = fresh_docs[0]["stringData"][b.TOKEN_KEY]
    assert len(token) >= 32 and token not in (RENDER_PASSWORD,
                                              fresh_docs[0]["stringData"]["password"])
    assert docs[0]["stringData"][b.TOKEN_KEY] == RENDER_PASSWORD
    # and the job's own CA and server certificate, which verify as a chain
    from cryptography import x509

    pem = fresh_docs[0]["stringData"]
    ca, cert = (x509.load_pem_x509_certificate(pem[k].encode()) for k in ("ca.crt", "tls.crt"))
    cert.verify_directly_issued_by(ca)
    assert "PRIVATE KEY" in pem["tls.key"] and "PRIVATE KEY" not in pem["tls.crt"]


def test_runtime_image_replaces_only_the_default_image():
    from rljob.api.builders import build_trainer_pod, with_runtime_image

    job = load_rljob(str(REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml"))
    assert job.spec.image == "rljob/runtime:0.1.0"  # names none: the default
    mine = with_runtime_image(job, "registry.example/rljob/runtime:0.1.0")
    pod = build_trainer_pod(mine, 0)
    assert {c["image"] for c in pod["spec"]["containers"]} == {
        "registry.example/rljob/runtime:0.1.0"}
    assert with_runtime_image(job, None) is job and with_runtime_image(job, "") is job
    own = job.model_copy(update={"spec": job.spec.model_copy(update={"image": "a/b:1"})})
    assert with_runtime_image(own, "registry.example/x:1").spec.image == "a/b:1"


def test_rank_0_checks_the_job_in_its_pod_before_the_trainer_starts():
    """An init container on rank 0 only, with the job's volumes (PVCs included) and
    its termination message falling back to the log."""
    job = load("quickstart-cluster.yaml")
    job.spec.dataset.pvc = "prompts"
    rank0, rank1 = b.build_trainer_pod(job, 0), b.build_trainer_pod(job, 1)
    assert "initContainers" not in rank1["spec"]
    [init] = rank0["spec"]["initContainers"]
    assert init["name"] == "preflight"
    assert init["command"] == ["rljob", "worker", "preflight", "--job", b.JOB_FILE]
    assert init["image"] == rank0["spec"]["containers"][0]["image"]
    mounts = {m["mountPath"] for m in init["volumeMounts"]}
    assert {b.JOB_DIR, "/data"} <= mounts and "/dev/shm" not in mounts
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_wandb_api_key_reaches_the_trainer_from_its_secret():
    job = load("quickstart-cluster.yaml")
    assert all(e["name"] != "WANDB_API_KEY" for e in b.build_trainer_pod(job, 0)["spec"]
               ["containers"][0]["env"])
    job.spec.logging.wandb = WandbSpec(project="p", api_key_secret="wandb")
    pod = b.build_trainer_pod(job, 0)["spec"]
    for c in (pod["containers"][0], pod["initContainers"][0]):  # preflight checks it too
        [key] = [e for e in c["env"] if e["name"] == "WANDB_API_KEY"]
        assert key["valueFrom"] == {"secretKeyRef": {"name": "wandb", "key": "apiKey"}}


def test_rollout_and_trainer_on_their_own_accelerators():
    """rollout.accelerator / trainer.accelerator override the job's: each role's pods
    get their own resource name, node selector, devices and HCCL settings; weights go
    over gRPC between different kinds."""
    from rljob.api.spec import AcceleratorSpec

    job = load("grpo-qwen2.5-7b-ascend.yaml")
    job.spec.rollout.accelerator = AcceleratorSpec(
        type="gpu", node_selector={"pool": "inference"})
    trainer = b.build_trainer_pod(job, 0)["spec"]
    rollout = b.build_rollout_pod(job, 0)["spec"]
    t_res, r_res = (p["containers"][0]["resources"]["limits"] for p in (trainer, rollout))
    assert "huawei.com/Ascend910" in t_res and "nvidia.com/gpu" not in t_res
    assert r_res["nvidia.com/gpu"] == str(job.spec.rollout.npus_per_replica)
    assert "huawei.com/Ascend910" not in r_res
    assert rollout["nodeSelector"] == {"pool": "inference"}
    assert trainer.get("nodeSelector") == (job.spec.accelerator.node_selector or None)
    env = lambda pod: {e["name"] for e in pod["containers"][0]["env"]}  # noqa: E731
    assert "HCCL_CONNECT_TIMEOUT" in env(trainer) and "HCCL_CONNECT_TIMEOUT" not in env(rollout)
    mounts = lambda pod: {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}  # noqa: E731
    assert "/usr/local/Ascend/driver" in mounts(trainer)
    assert "/usr/local/Ascend/driver" not in mounts(rollout)
    assert job.spec.weight_transport == "grpc"  # no collective across kinds
    job.spec.rollout.accelerator = None
    assert job.spec.weight_transport == "collective"


def test_every_pod_tolerates_a_lost_node_for_the_seconds_the_job_sets():
    """runPolicy.notReadyTolerationSeconds: every pod of the job (trainer, rollout,
    TransferQueue, Redis) tolerates the taints a NotReady or unreachable node gets for
    that long, before a podTemplateOverride's tolerations; unset, no pod names them
    (the API server's default, 300 s, applies)."""
    def tolerations(job) -> dict[str, list[dict]]:
        out = {}
        for o in b.build_all(job, "pw"):
            spec = o["spec"]["template"]["spec"] if o["kind"] in (
                "Deployment", "StatefulSet") else o["spec"] if o["kind"] == "Pod" else None
            if spec is not None:
                out[o["metadata"]["name"]] = spec.get("tolerations", [])
        return out

    unset = tolerations(load("quickstart-cluster.yaml"))
    assert set(unset) == {"quickstart-cluster-redis", "quickstart-cluster-tq",
                          "quickstart-cluster-trainer-0", *(f"quickstart-cluster-rollout-{i}"
                                                            for i in range(2))}
    assert not any(unset.values()), unset
    job = load("quickstart-cluster.yaml")
    job.spec.run_policy.not_ready_toleration_seconds = 20
    job.spec.pod_template_overrides = type(job.spec).model_validate(
        {"model": {"path": "-"}, "dataset": {"path": "-"}, "podTemplateOverrides": [
            {"roles": ["trainer"], "spec": {"tolerations": [
                {"key": "dedicated", "operator": "Exists"}]}}]}).pod_template_overrides
    lost = [{"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 20} for k in ("not-ready", "unreachable")]
    for name, tol in tolerations(job).items():
        extra = [{"key": "dedicated", "operator": "Exists"}] if "trainer" in name else []
        assert tol == lost + extra, (name, tol)
