"""RLJob → Kubernetes objects, as pure functions.

The operator's handlers (`rljob_operator`) call these and create-or-patch the
result; `rljob render` prints the same objects. They live with the contract, so
the runtime never imports the operator (the operator imports the runtime). Nothing here talks to a cluster, so every
object the operator creates is unit-tested without one.

Children of RLJob NAME (deterministic names, all owned by the RLJob):

    NAME-tq-auth        Secret       generated Redis password
    NAME-spec           ConfigMap    the resolved job (every default filled in)
    NAME-redis          Service      headless: stable DNS per storage unit
    NAME-redis          StatefulSet  one Redis per TransferQueue storage unit
    NAME-tq             Service      TransferQueue controller gRPC + metrics
    NAME-tq             Deployment   TransferQueue controller + workflow driver
    NAME-trainer        Service      headless: the gang's DNS (MASTER_ADDR, weights)
    NAME-trainer        PodGroup     Volcano gang (scheduling.schedulerName: volcano)
    NAME-trainer-R      Pod          trainer rank R (one pod per node)
    NAME-rollout-I      Pod          rollout replica I (added/removed one at a time)

Trainer and rollout replicas are bare pods owned by the RLJob, not a
StatefulSet: the operator restarts the trainer gang as a whole (every rank
resumes from one checkpoint) and picks which rollout replica to remove.
"""

from __future__ import annotations

import secrets
from typing import Any

import yaml

from rljob.api import API_VERSION, KIND, RLJob
from rljob.contract import (  # noqa: F401 - the contract's names, read here as builders.X
    ANNOTATION_GANG_RESTART,
    DRIVER_METRICS_PORT,
    LABEL_NAME,
    LABEL_RANK,
    LABEL_REPLICA,
    LABEL_ROLE,
    MANAGED_BY,
    MASTER_PORT,
    METRICS_PORT,
    PASSWORD_ENV,
    PREFLIGHT_CONTAINER,
    REDIS_PORT,
    TQ_PORT,
    WEIGHTS_PORT,
    listen_address,
    local_address,
    worker_argv,
)

JOB_DIR = "/etc/rljob"
JOB_FILE = f"{JOB_DIR}/job.yaml"
CHECKPOINT_DIR = "/checkpoints"
PASSWORD_KEY = "password"
WANDB_KEY = "apiKey"  # the key of logging.wandb.apiKeySecret holding the W&B API key

# Host paths the Ascend driver stack needs inside a container (what the
# Ascend device plugin does not mount by itself).
ASCEND_HOST_PATHS = (
    ("ascend-driver", "/usr/local/Ascend/driver", "Directory"),
    ("ascend-dcmi", "/usr/local/dcmi", "Directory"),
    ("npu-smi", "/usr/local/bin/npu-smi", "File"),
    ("ascend-install-info", "/etc/ascend_install.info", "File"),
)
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"


# ---- names and labels -------------------------------------------------------

def secret_name(job: str) -> str:
    return f"{job}-tq-auth"


def config_map_name(job: str) -> str:
    return f"{job}-spec"


def redis_name(job: str) -> str:
    return f"{job}-redis"


def tq_name(job: str) -> str:
    return f"{job}-tq"


def trainer_name(job: str) -> str:
    return f"{job}-trainer"


def trainer_pod_name(job: str, rank: int) -> str:
    return f"{job}-trainer-{rank}"


def rollout_pod_name(job: str, index: int) -> str:
    return f"{job}-rollout-{index}"


def labels(job: str, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "rljob",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/part-of": "rljob",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_NAME: job,
        LABEL_ROLE: role,
    }


def selector(job: str, role: str) -> dict[str, str]:
    return {LABEL_NAME: job, LABEL_ROLE: role}


def selector_string(job: str, role: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(job, role).items())


# ---- addresses --------------------------------------------------------------

def _ns(job: RLJob) -> str:
    return job.metadata.namespace or "default"


def tq_address(job: RLJob) -> str:
    return f"{tq_name(job.metadata.name)}.{_ns(job)}.svc:{TQ_PORT}"


def master_host(job: RLJob) -> str:
    name = job.metadata.name
    return f"{trainer_pod_name(name, 0)}.{trainer_name(name)}.{_ns(job)}.svc"


def weights_address(job: RLJob) -> str:
    return f"{master_host(job)}:{WEIGHTS_PORT}"


def redis_urls(job: RLJob) -> list[str]:
    name = job.metadata.name
    return [f"redis://{redis_name(name)}-{i}.{redis_name(name)}.{_ns(job)}.svc:{REDIS_PORT}/0"
            for i in range(job.spec.transfer_queue.storage_units)]


# ---- shared pieces ----------------------------------------------------------

def _meta(job: RLJob, name: str, role: str, extra_labels: dict | None = None,
          annotations: dict | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": _ns(job),
        "labels": {**labels(job.metadata.name, role), **(extra_labels or {})},
    }
    if annotations:
        meta["annotations"] = annotations
    uid = (job.metadata.model_extra or {}).get("uid")
    if uid:
        meta["ownerReferences"] = [{
            "apiVersion": API_VERSION, "kind": KIND, "name": job.metadata.name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True,
        }]
    return meta


def _password_env(job: RLJob, env_name: str = PASSWORD_ENV) -> dict:
    return {"name": env_name, "valueFrom": {"secretKeyRef": {
        "name": secret_name(job.metadata.name), "key": PASSWORD_KEY}}}


def _env_common(job: RLJob) -> list[dict]:
    return [
        _password_env(job),
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]


def _hccl_env(job: RLJob, role: str) -> list[dict]:
    """HCCL settings for Ascend collectives (trainer gang, tensor-parallel rollouts)."""
    acc = job.spec.accelerator_for(role)
    if acc.type != "ascend":
        return []
    h = acc.hccl
    env = [
        {"name": "HCCL_IF_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "HCCL_CONNECT_TIMEOUT", "value": str(h.connect_timeout_seconds)},
        {"name": "HCCL_EXEC_TIMEOUT", "value": str(h.exec_timeout_seconds)},
    ]
    if h.socket_ifname:
        env.append({"name": "HCCL_SOCKET_IFNAME", "value": h.socket_ifname})
        env.append({"name": "GLOO_SOCKET_IFNAME", "value": h.socket_ifname})
    if h.if_base_port:
        env.append({"name": "HCCL_IF_BASE_PORT", "value": str(h.if_base_port)})
    return env


def _wandb_env(job: RLJob) -> list[dict]:
    """The W&B API key from `logging.wandb.apiKeySecret` (key `apiKey`)."""
    cfg = job.spec.logging.wandb
    if cfg is None or not cfg.api_key_secret:
        return []
    return [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {
        "name": cfg.api_key_secret, "key": WANDB_KEY}}}]


def _restricted() -> dict:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": False}


def _non_root_pod(uid: int = 1000) -> dict:
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _accelerated_pod_security(job: RLJob, role: str) -> dict:
    # The Ascend driver's device files and libraries are usable by root or the
    # HwHiAiUser group only in the common vllm-ascend / MindSpeed images, so
    # accelerator pods keep the image's user; CPU pods run as non-root.
    if job.spec.accelerator_for(role).type == "cpu":
        return _non_root_pod()
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def _volumes(job: RLJob, shm: bool, role: str | None = None) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts) every worker container of the job gets (`role`: a rollout's or
    trainer's, with its accelerator's host paths)."""
    name = job.metadata.name
    vols: list[dict] = [{"name": "job", "configMap": {"name": config_map_name(name)}}]
    mounts: list[dict] = [{"name": "job", "mountPath": JOB_DIR, "readOnly": True}]
    if job.spec.model.pvc:
        vols.append({"name": "models", "persistentVolumeClaim": {
            "claimName": job.spec.model.pvc, "readOnly": True}})
        mounts.append({"name": "models", "mountPath": "/models", "readOnly": True})
    if job.spec.dataset.pvc:
        vols.append({"name": "data", "persistentVolumeClaim": {
            "claimName": job.spec.dataset.pvc, "readOnly": True}})
        mounts.append({"name": "data", "mountPath": "/data", "readOnly": True})
    if shm:
        # torch and the collective libraries pass tensors through /dev/shm;
        # the container runtime's 64 MiB default is far too small.
        vols.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if role is not None and job.spec.accelerator_for(role).type == "ascend":
        for vname, path, kind in ASCEND_HOST_PATHS:
            vols.append({"name": vname, "hostPath": {"path": path, "type": kind}})
            mounts.append({"name": vname, "mountPath": path, "readOnly": True})
    return vols, mounts


def _worker_resources(job: RLJob, role: str, count: int, compute) -> dict:
    """A rollout's or trainer's container: `count` accelerators, and the role's CPU and
    memory (`rollout.resources` / `trainer.resources`) as requests and limits. The CPU
    limit is what the worker sizes its compute threads by (`device.cores_given`): CPU
    replicas on one node do not oversubscribe its cores."""
    amounts = {k: v for k, v in compute.model_dump().items() if v is not None}
    resource = job.spec.accelerator_for(role).resource
    if resource is not None:
        amounts[resource] = str(count)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _scheduling(job: RLJob, pod_spec: dict, role: str) -> None:
    s = job.spec.scheduling
    if s.scheduler_name:
        pod_spec["schedulerName"] = s.scheduler_name
    if s.priority_class_name:
        pod_spec["priorityClassName"] = s.priority_class_name
    selector = job.spec.accelerator_for(role).node_selector
    if selector:
        pod_spec["nodeSelector"] = dict(selector)


def _metrics_port(port: int = METRICS_PORT, name: str = "metrics") -> dict:
    return {"name": name, "containerPort": port, "protocol": "TCP"}


def _http_probe(port: int, path: str = "/metrics", period: int = 10) -> dict:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period,
            "failureThreshold": 3}


# ---- objects ----------------------------------------------------------------

def resolved_job(job: RLJob) -> dict:
    """The job as the workers read it: every default filled in, no status."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": job.metadata.name, "namespace": _ns(job)},
        "spec": job.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def build_config_map(job: RLJob) -> dict:
    name = job.metadata.name
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": _meta(job, config_map_name(name), "config"),
        "data": {"job.yaml": yaml.safe_dump(resolved_job(job), sort_keys=False)},
    }


def new_password() -> str:
    return secrets.token_urlsafe(24)


def build_secret(job: RLJob, password: str) -> dict:
    name = job.metadata.name
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": _meta(job, secret_name(name), "transferqueue"),
        "stringData": {PASSWORD_KEY: password},
    }


def _headless_service(job: RLJob, name: str, role: str, ports: dict[str, int]) -> dict:
    """Stable per-pod DNS names, published before the pods are ready (ranks and
    storage units must resolve each other while starting)."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(job, name, role),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector(job.metadata.name, role),
            "ports": [{"name": n, "port": port, "targetPort": port} for n, port in ports.items()],
        },
    }


def build_redis_service(job: RLJob) -> dict:
    return _headless_service(job, redis_name(job.metadata.name), "storage", {"redis": REDIS_PORT})


def build_redis_statefulset(job: RLJob) -> dict:
    name = job.metadata.name
    tq = job.spec.transfer_queue
    res = {k: v for k, v in tq.redis.resources.model_dump().items() if v is not None}
    # the append-only file always: a redis that crashes or is OOM-killed comes back with
    # the table and the controller's journal (in an emptyDir: the pod's life; on a PVC
    # with persistence: the pod may be rescheduled too)
    args = ["--port", str(REDIS_PORT), "--requirepass", f"$({PASSWORD_ENV})",
            "--protected-mode", "no", "--save", "", "--appendonly", "yes",
            "--appendfsync", "everysec", "--dir", "/data"]
    container = {
        "name": "redis",
        "image": tq.redis.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["redis-server"],
        "args": args,
        "env": [_password_env(job), _password_env(job, "REDISCLI_AUTH")],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
        "readinessProbe": {"exec": {"command": ["sh", "-c", "redis-cli ping | grep -q PONG"]},
                           "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": REDIS_PORT}, "periodSeconds": 10,
                          "failureThreshold": 6},
        "resources": {"requests": dict(res), "limits": dict(res)},
        "securityContext": _restricted(),
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # the official redis image's user
        "securityContext": _non_root_pod(999),
        "enableServiceLinks": False,
    }
    spec: dict[str, Any] = {
        "serviceName": redis_name(name),
        "replicas": tq.storage_units,
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector(name, "storage")},
        "template": {
            "metadata": {"labels": labels(name, "storage")},
            "spec": pod_spec,
        },
    }
    if not tq.redis.persistence:
        pod_spec["volumes"] = [{"name": "data", "emptyDir": {}}]
    else:
        spec["volumeClaimTemplates"] = [{
            "metadata": {"name": "data", "labels": labels(name, "storage")},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": tq.redis.storage_size}}},
        }]
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": _meta(job, redis_name(name), "storage"), "spec": spec}


def build_tq_service(job: RLJob) -> dict:
    name = job.metadata.name
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(job, tq_name(name), "transferqueue"),
        "spec": {
            "selector": selector(name, "transferqueue"),
            "ports": [
                {"name": "grpc", "port": TQ_PORT, "targetPort": TQ_PORT, "appProtocol": "grpc"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT},
                {"name": "driver-metrics", "port": DRIVER_METRICS_PORT,
                 "targetPort": DRIVER_METRICS_PORT},
            ],
        },
    }


_SUFFIX = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50,
           "Ei": 2 ** 60, "m": 10 ** -3, "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9,
           "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18}


def _quantity(q: str) -> float:
    """A Kubernetes quantity as a number ("2Gi" -> 2147483648.0)."""
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * _SUFFIX[suffix]
    return float(q)


def _requests(res, memory_limit: str) -> dict:
    """A container's requests, and a memory limit of `memory_limit` or the request."""
    requests = {k: v for k, v in res.model_dump().items() if v is not None}
    limit = memory_limit
    if "memory" in requests and _quantity(requests["memory"]) > _quantity(limit):
        limit = requests["memory"]
    return {"requests": requests, "limits": {"memory": limit}}


def build_tq_deployment(job: RLJob) -> dict:
    """TransferQueue controller and the workflow driver, one pod: the driver
    releases prompts into this controller, and both hold only in-memory state
    that must restart together."""
    name = job.metadata.name
    tq = job.spec.transfer_queue
    vols, mounts = _volumes(job, shm=False)
    grpc_probe = {"grpc": {"port": TQ_PORT}, "periodSeconds": 5}
    tq_argv = worker_argv("transferqueue", listen=listen_address(TQ_PORT), job=name,
                          redis=redis_urls(job), password_env=PASSWORD_ENV,
                          lease_seconds=tq.lease_seconds, metrics_port=METRICS_PORT)
    driver_argv = worker_argv("driver", job=JOB_FILE, tq=local_address(TQ_PORT),
                              weights=weights_address(job), metrics_port=DRIVER_METRICS_PORT)
    controller = {
        "name": "transferqueue",
        "image": job.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["rljob", *tq_argv[:2]],
        "args": tq_argv[2:],
        "env": _env_common(job),
        "ports": [{"name": "grpc", "containerPort": TQ_PORT}, _metrics_port()],
        "readinessProbe": grpc_probe,
        "livenessProbe": {**grpc_probe, "periodSeconds": 10, "failureThreshold": 6},
        "resources": _requests(tq.resources, memory_limit="8Gi"),
        "securityContext": _restricted(),
    }
    driver = {
        "name": "driver",
        "image": job.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["rljob", *driver_argv[:2]],
        "args": driver_argv[2:],
        "env": _env_common(job),
        "ports": [_metrics_port(DRIVER_METRICS_PORT, "driver-metrics")],
        "volumeMounts": mounts,
        "resources": _requests(tq.driver_resources, memory_limit="4Gi"),
        "securityContext": _restricted(),
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(job, tq_name(name), "transferqueue"),
        "spec": {
            "replicas": 1,
            # never two controllers for one table
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector(name, "transferqueue")},
            "template": {
                "metadata": {"labels": labels(name, "transferqueue")},
                "spec": {
                    "containers": [controller, driver],
                    "volumes": vols,
                    "securityContext": _non_root_pod(),
                    "enableServiceLinks": False,
                },
            },
        },
    }


def build_trainer_service(job: RLJob) -> dict:
    return _headless_service(job, trainer_name(job.metadata.name), "trainer",
                             {"master": MASTER_PORT, "weights": WEIGHTS_PORT,
                              "metrics": METRICS_PORT})


def volcano(job: RLJob) -> bool:
    return job.spec.scheduling.scheduler_name == "volcano"


def build_pod_group(job: RLJob) -> dict:
    """Volcano gang: every trainer rank is scheduled, or none is."""
    name = job.metadata.name
    spec: dict[str, Any] = {"minMember": job.spec.trainer.num_nodes}
    if job.spec.scheduling.queue:
        spec["queue"] = job.spec.scheduling.queue
    if job.spec.scheduling.priority_class_name:
        spec["priorityClassName"] = job.spec.scheduling.priority_class_name
    resource = job.spec.accelerator_for("trainer").resource
    if resource:
        total = job.spec.trainer.num_nodes * job.spec.trainer.npus_per_node
        spec["minResources"] = {resource: str(total)}
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": _meta(job, trainer_name(name), "trainer"), "spec": spec}


def trainer_command(job: RLJob, resume: bool) -> list[str]:
    """One process per accelerator: torchrun spawns them when a node has more
    than one; each runs the same `rljob worker trainer` entrypoint."""
    t = job.spec.trainer
    worker = ["rljob", *worker_argv(
        "trainer", job=JOB_FILE, tq=tq_address(job), weights_listen=listen_address(WEIGHTS_PORT),
        master="$(MASTER_ADDR):$(MASTER_PORT)", metrics_port=METRICS_PORT, resume=resume,
        run_dir=f"{CHECKPOINT_DIR}/{job.metadata.name}" if t.checkpoint_pvc else None)]
    if t.npus_per_node == 1:
        return worker
    return ["torchrun", f"--nnodes={t.num_nodes}", f"--nproc-per-node={t.npus_per_node}",
            "--node-rank=$(NODE_RANK)", "--master-addr=$(MASTER_ADDR)",
            "--master-port=$(MASTER_PORT)", "--no-python", *worker]


def build_preflight_container(job: RLJob, mounts: list[dict]) -> dict:
    """Rank 0's init container: `rljob worker preflight` checks the job with its
    volumes mounted (what `rljob validate` cannot see from outside: paths on the
    PVCs, the tokenizer, dataset keys, the reward, the context length). Its problems
    are its termination message; the operator ends the job with them
    (Failed/PreflightFailed) instead of restarting a gang that cannot start."""
    return {
        "name": PREFLIGHT_CONTAINER,
        "image": job.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["rljob", *worker_argv("preflight", job=JOB_FILE)],
        "env": [*_env_common(job), *_wandb_env(job)],
        "volumeMounts": [m for m in mounts if m["name"] != "dshm"],
        "resources": _requests(job.spec.transfer_queue.driver_resources, memory_limit="4Gi"),
        "securityContext": _restricted(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def build_trainer_pod(job: RLJob, rank: int, restarts: int = 0,
                      resume: bool | None = None) -> dict:
    """Trainer node `rank`. After a gang restart (or, with `resume`, a trainer pod
    recreated once the job made progress) every rank resumes from the last
    checkpoint (`--resume`)."""
    name = job.metadata.name
    t = job.spec.trainer
    accelerated = job.spec.accelerator_for("trainer").type != "cpu"
    vols, mounts = _volumes(job, shm=True, role="trainer")
    if t.checkpoint_pvc:
        vols.append({"name": "checkpoints",
                     "persistentVolumeClaim": {"claimName": t.checkpoint_pvc}})
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_DIR})
    env = [
        *_env_common(job),
        {"name": "MASTER_ADDR", "value": master_host(job)},
        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
        {"name": "NNODES", "value": str(t.num_nodes)},
        {"name": "NODE_RANK", "value": str(rank)},
        *([{"name": "RANK", "value": str(rank)}, {"name": "WORLD_SIZE", "value": str(t.num_nodes)}]
          if t.npus_per_node == 1 else []),
        {"name": "NPROC_PER_NODE", "value": str(t.npus_per_node)},
        *_hccl_env(job, "trainer"),
        *_wandb_env(job),
    ]
    container = {
        "name": "trainer",
        "image": job.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": trainer_command(job, resume=restarts > 0 if resume is None else resume),
        "env": env,
        "ports": [{"name": "master", "containerPort": MASTER_PORT},
                  {"name": "weights", "containerPort": WEIGHTS_PORT}, _metrics_port()],
        "readinessProbe": _http_probe(METRICS_PORT),
        "volumeMounts": mounts,
        "resources": _worker_resources(job, "trainer", t.npus_per_node, t.resources),
        "securityContext": _restricted() if not accelerated else
        {"allowPrivilegeEscalation": False},
    }
    annotations = {ANNOTATION_GANG_RESTART: str(restarts)}
    spec: dict[str, Any] = {
        "hostname": trainer_pod_name(name, rank),
        "subdomain": trainer_name(name),
        # the operator restarts the gang as a whole; a lone rank restarting
        # in place would hang its peers' collectives
        "restartPolicy": "Never",
        **({"initContainers": [build_preflight_container(job, mounts)]} if rank == 0 else {}),
        "containers": [container],
        "volumes": vols,
        "securityContext": _accelerated_pod_security(job, "trainer"),
        "enableServiceLinks": False,
    }
    _scheduling(job, spec, "trainer")
    if volcano(job):
        annotations[VOLCANO_GROUP_ANNOTATION] = trainer_name(name)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(job, trainer_pod_name(name, rank), "trainer",
                              {LABEL_RANK: str(rank)}, annotations),
            "spec": spec}


def build_rollout_pod(job: RLJob, index: int) -> dict:
    name = job.metadata.name
    r = job.spec.rollout
    accelerated = job.spec.accelerator_for("rollout").type != "cpu"
    vols, mounts = _volumes(job, shm=True, role="rollout")
    container = {
        "name": "rollout",
        "image": job.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["rljob", *worker_argv("rollout", job=JOB_FILE, tq=tq_address(job),
                                          weights=weights_address(job), replica=index,
                                          metrics_port=METRICS_PORT)],
        "env": [*_env_common(job), *_hccl_env(job, "rollout")],
        "ports": [_metrics_port()],
        "readinessProbe": _http_probe(METRICS_PORT),
        "volumeMounts": mounts,
        "resources": _worker_resources(job, "rollout", r.npus_per_replica, r.resources),
        "securityContext": _restricted() if not accelerated else
        {"allowPrivilegeEscalation": False},
    }
    spec: dict[str, Any] = {
        # a crashed replica restarts in place: its leased rows return to the
        # queue when the lease lapses, and it fetches the latest weights first
        "restartPolicy": "Always",
        "containers": [container],
        "volumes": vols,
        "securityContext": _accelerated_pod_security(job, "rollout"),
        "enableServiceLinks": False,
    }
    _scheduling(job, spec, "rollout")
    annotations = None
    if volcano(job) and job.spec.scheduling.queue:
        annotations = {VOLCANO_QUEUE_ANNOTATION: job.spec.scheduling.queue}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(job, rollout_pod_name(name, index), "rollout",
                              {LABEL_REPLICA: str(index)}, annotations),
            "spec": spec}


# ---- sets -------------------------------------------------------------------

def build_services(job: RLJob) -> list[dict]:
    """The long-lived children applied on every reconcile (not the Secret:
    its password is generated once; not pods: they are created one by one)."""
    objs = [
        build_config_map(job),
        build_redis_service(job),
        build_redis_statefulset(job),
        build_tq_service(job),
        build_tq_deployment(job),
        build_trainer_service(job),
    ]
    if volcano(job):
        objs.append(build_pod_group(job))
    return objs


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's job.yaml) as readable `|` blocks."""


_LiteralDumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def to_yaml(objs: list[dict]) -> str:
    return yaml.dump_all(objs, Dumper=_LiteralDumper, sort_keys=False)


def with_runtime_image(job: RLJob, image: str | None) -> RLJob:
    """The job with its pods on `image` (the operator's runtimeImage) when the RLJob
    names no image of its own (spec.image left at its default)."""
    from rljob.api.spec import DEFAULT_IMAGE

    if not image or job.spec.image != DEFAULT_IMAGE:
        return job
    return job.model_copy(update={"spec": job.spec.model_copy(update={"image": image})})


def build_all(job: RLJob, password: str, trainer_restarts: int = 0) -> list[dict]:
    """Every object of a freshly created job, in creation order."""
    return [
        build_secret(job, password),
        *build_services(job),
        *[build_trainer_pod(job, r, trainer_restarts) for r in range(job.spec.trainer.num_nodes)],
        *[build_rollout_pod(job, i) for i in range(job.spec.rollout.replicas)],
    ]
