"""What every object of a job shares: the children's names and labels, the
addresses the workers reach each other at, and the pieces of their pods
(metadata, environment, volumes, security contexts, resources, probes)."""

from __future__ import annotations

from typing import Any

from rljob.api import API_VERSION, KIND, RLJob
from rljob.contract import (
    CA_FILE,
    CERT_FILE,
    KEY_FILE,
    LABEL_NAME,
    LABEL_ROLE,
    MANAGED_BY,
    METRICS_PORT,
    PASSWORD_ENV,
    REDIS_PORT,
    REDIS_USER,
    REDIS_USER_ENV,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TOKEN_ENV,
    TQ_PORT,
    WEIGHTS_PORT,
)


JOB_DIR = "/etc/rljob"
JOB_FILE = f"{JOB_DIR}/job.yaml"
CHECKPOINT_DIR = "/checkpoints"
PASSWORD_KEY = "password"
TOKEN_KEY = "token"  # the job's token (infra/auth.py), in the same Secret
# with transferQueue.tls, the job's CA and server certificate (infra/tls.py), there too
TLS_KEYS = {TLS_CA_ENV: CA_FILE, TLS_CERT_ENV: CERT_FILE, TLS_KEY_ENV: KEY_FILE}
WANDB_KEY = "apiKey"  # the key of logging.wandb.apiKeySecret holding the W&B API key
REWARD_KEY = "apiKey"  # the key of reward.url.apiKeySecret holding the service's key
REWARD_KEY_ENV = "RLJOB_REWARD_API_KEY"  # where a reward pod reads it (reward/remote.py)

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


def reward_pod_name(job: str, index: int) -> str:
    return f"{job}-reward-{index}"


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
    scheme = "rediss" if job.spec.transfer_queue.tls else "redis"
    return [f"{scheme}://{redis_name(name)}-{i}.{redis_name(name)}.{_ns(job)}.svc:{REDIS_PORT}/0"
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


def _token_env(job: RLJob) -> dict:
    return {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {
        "name": secret_name(job.metadata.name), "key": TOKEN_KEY}}}


def _tls_env(job: RLJob) -> list[dict]:
    """The job's CA, certificate and key (transferQueue.tls: infra/tls.py), if on."""
    if not job.spec.transfer_queue.tls:
        return []
    return [{"name": env, "valueFrom": {"secretKeyRef": {
        "name": secret_name(job.metadata.name), "key": key}}} for env, key in TLS_KEYS.items()]


def _env_common(job: RLJob) -> list[dict]:
    return [
        _password_env(job),
        {"name": REDIS_USER_ENV, "value": REDIS_USER},
        _token_env(job),
        *_tls_env(job),
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


def _reward_key_env(job: RLJob) -> list[dict]:
    """The scoring service's key from `reward.url.apiKeySecret` (key `apiKey`)."""
    url = job.spec.reward.url
    if url is None or not url.api_key_secret:
        return []
    return [{"name": REWARD_KEY_ENV, "valueFrom": {"secretKeyRef": {
        "name": url.api_key_secret, "key": REWARD_KEY}}}]


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
    scorer = job.spec.reward.model
    if role == "reward" and scorer is not None and scorer.pvc:
        vols.append({"name": "reward-models", "persistentVolumeClaim": {
            "claimName": scorer.pvc, "readOnly": True}})
        mounts.append({"name": "reward-models", "mountPath": "/reward-models", "readOnly": True})
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


# the NoExecute taints a node gets when its kubelet stops reporting (NotReady) or
# cannot be reached: the node lifecycle controller evicts the pods that do not
# tolerate them, after tolerationSeconds for those that do (300 by the API server's
# DefaultTolerationSeconds for a pod that names neither)
NODE_LOSS_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def node_loss_tolerations(job: RLJob, pod_spec: dict) -> None:
    """runPolicy.notReadyTolerationSeconds as the pod's tolerations of
    `NODE_LOSS_TAINTS`, in place (none when unset: the cluster's default applies)."""
    seconds = job.spec.run_policy.not_ready_toleration_seconds
    if seconds is None:
        return
    pod_spec["tolerations"] = [*pod_spec.get("tolerations", []), *(
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
        for key in NODE_LOSS_TAINTS)]


def _scheduling(job: RLJob, pod_spec: dict, role: str) -> None:
    node_loss_tolerations(job, pod_spec)
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


_SUFFIX = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50,
           "Ei": 2 ** 60, "m": 10 ** -3, "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9,
           "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18}


def quantity(q: str) -> float:
    """A Kubernetes quantity as a number ("2Gi" -> 2147483648.0)."""
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * _SUFFIX[suffix]
    return float(q)


def _requests(res, memory_limit: str) -> dict:
    """A container's requests, and a memory limit of `memory_limit` or the request."""
    requests = {k: v for k, v in res.model_dump().items() if v is not None}
    limit = memory_limit
    if "memory" in requests and quantity(requests["memory"]) > quantity(limit):
        limit = requests["memory"]
    return {"requests": requests, "limits": {"memory": limit}}


def volcano(job: RLJob) -> bool:
    return job.spec.scheduling.scheduler_name == "volcano"


def _wire(items) -> list[dict]:
    return [i.model_dump(mode="json", by_alias=True, exclude_none=True) for i in items]


def with_overrides(job: RLJob, role: str, meta: dict, pod_spec: dict,
                   own: tuple[str, ...]) -> None:
    """Add the job's podTemplateOverrides naming `role`, in order (`_with_override`)."""
    for override in job.spec.overrides_for(role):
        _with_override(meta, pod_spec, override, own)


def _with_override(meta: dict, pod_spec: dict, template, own: tuple[str, ...]) -> None:
    """Add one podTemplateOverride (spec/pods.py) to a pod's metadata and spec, in place:
    labels, annotations, node selector (its keys over accelerator.nodeSelector's),
    tolerations, affinity, volumes, sidecars, init containers (before the operator's),
    image pull secrets, service account and scheduling gates; its `container` env and
    mounts go to the containers named in `own` (init containers included: the trainer's
    preflight reads what the trainer reads). The spec's rules keep the operator's own
    names out of it, so nothing here overwrites them."""
    t, s = template, template.spec
    if t.metadata.labels:
        meta.setdefault("labels", {}).update(t.metadata.labels)
    if t.metadata.annotations:
        meta.setdefault("annotations", {}).update(t.metadata.annotations)
    if s.node_selector:
        pod_spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), **s.node_selector}
    for key, items in (("tolerations", s.tolerations), ("volumes", s.volumes),
                       ("containers", s.containers), ("imagePullSecrets", s.image_pull_secrets),
                       ("schedulingGates", s.scheduling_gates)):
        if items:
            pod_spec[key] = [*pod_spec.get(key, []), *_wire(items)]
    if s.init_containers:
        pod_spec["initContainers"] = [*_wire(s.init_containers),
                                      *pod_spec.get("initContainers", [])]
    if s.affinity:
        pod_spec["affinity"] = s.affinity
    if s.service_account_name:
        pod_spec["serviceAccountName"] = s.service_account_name
    env, mounts = _wire(t.container.env), _wire(t.container.volume_mounts)
    for c in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
        if c["name"] in own:
            if env:
                c["env"] = [*c.get("env", []), *env]
            if mounts:
                c["volumeMounts"] = [*c.get("volumeMounts", []), *mounts]
