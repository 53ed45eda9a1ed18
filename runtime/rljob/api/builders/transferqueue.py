"""The TransferQueue's objects: the job's Secret and ConfigMap, the Redis storage
units (headless Service, StatefulSet) and the controller with the workflow driver
(Service, Deployment)."""

from __future__ import annotations

import secrets
from typing import Any

import yaml

from rljob.api import API_VERSION, KIND, RLJob
from rljob.contract import (
    CA_FILE,
    CERT_FILE,
    DRIVER_METRICS_PORT,
    HEALTH_PORT,
    KEY_FILE,
    METRICS_PORT,
    PASSWORD_ENV,
    REDIS_COMMANDS,
    REDIS_PORT,
    REDIS_USER,
    TQ_PORT,
    listen_address,
    local_address,
    worker_argv,
)

from .common import (
    JOB_FILE,
    PASSWORD_KEY,
    TLS_KEYS,
    TOKEN_KEY,
    _env_common,
    _headless_service,
    _meta,
    _metrics_port,
    _non_root_pod,
    _ns,
    _password_env,
    _requests,
    _restricted,
    _volumes,
    config_map_name,
    labels,
    node_loss_tolerations,
    redis_name,
    redis_urls,
    secret_name,
    selector,
    tq_name,
    weights_address,
    with_overrides,
)


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


def build_secret(job: RLJob, password: str, token: str, tls: dict[str, str] | None = None
                 ) -> dict:
    """The job's credentials: its storage units' password, its token (every gRPC
    server of the job answers only callers that present it: infra/auth.py) and, with
    transferQueue.tls, its CA and server certificate (`tls`: PEM text by environment
    variable, `infra.tls.Pems.env()`)."""
    name = job.metadata.name
    pems = {TLS_KEYS[env]: pem for env, pem in (tls or {}).items()}
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": _meta(job, secret_name(name), "transferqueue"),
        "stringData": {PASSWORD_KEY: password, TOKEN_KEY: token, **pems},
    }


def redis_aof_args(fsync: str = "always") -> list[str]:
    """redis-server arguments for its append-only file, synced as `fsync` says (pure).
    Every unit runs "always": written and synced before redis answers, so what a unit
    acknowledged (a row's cells, a record of the controller's journal) survives redis
    killed and the node's power cut. "everysec" holds a write back for up to 2 s while
    a sync is slow, and loses what it holds with the process: a journal acknowledged to
    the controller is then missing from the file it restarts on."""
    return ["--appendonly", "yes", "--appendfsync", fsync]


def redis_acl_args(password: str, keys: str = "*") -> list[str]:
    """redis-server arguments that turn Redis's default user off and admit one user,
    `REDIS_USER` with `password`, to the commands the storage units send on the keys
    matching `keys` (pure)."""
    return ["--user", "default", "off",
            "--user", REDIS_USER, "on", f">{password}", "resetkeys", f"~{keys}",
            "resetchannels", "-@all", *(f"+{c}" for c in REDIS_COMMANDS)]


TLS_DIR = "/etc/rljob-tls"  # a Redis unit's certificate files


def redis_tls_args(directory: str, port: int) -> list[str]:
    """redis-server arguments that serve TLS alone on `port`, with the job's certificate
    from `directory`; a client is the ACL user's business, not a client
    certificate's (pure)."""
    return ["--port", "0", "--tls-port", str(port),
            "--tls-cert-file", f"{directory}/{CERT_FILE}",
            "--tls-key-file", f"{directory}/{KEY_FILE}",
            "--tls-ca-cert-file", f"{directory}/{CA_FILE}", "--tls-auth-clients", "no"]


def build_redis_service(job: RLJob) -> dict:
    return _headless_service(job, redis_name(job.metadata.name), "storage", {"redis": REDIS_PORT})


def build_redis_statefulset(job: RLJob) -> dict:
    name = job.metadata.name
    tq = job.spec.transfer_queue
    res = {k: v for k, v in tq.redis.resources.model_dump().items() if v is not None}
    # the append-only file always: a redis that crashes or is OOM-killed comes back with
    # the table and the controller's journal (in an emptyDir: the pod's life; on a PVC
    # with persistence: the pod may be rescheduled too)
    # the job's own user only, on the job's keys: a caller with the password alone (the
    # default user) or a command the units never send (FLUSHALL, CONFIG, KEYS) is refused
    # with transferQueue.tls, TLS alone, on the job's certificate (its clients' rediss://)
    listen = (redis_tls_args(TLS_DIR, REDIS_PORT) if tq.tls
              else ["--port", str(REDIS_PORT)])
    cli = f"redis-cli --tls --cacert {TLS_DIR}/{CA_FILE}" if tq.tls else "redis-cli"
    args = [*listen, *redis_acl_args(f"$({PASSWORD_ENV})", f"{name}:*"),
            "--protected-mode", "no", "--save", "", *redis_aof_args(), "--dir", "/data"]
    container = {
        "name": "redis",
        "image": tq.redis.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["redis-server"],
        "args": args,
        "env": [_password_env(job), _password_env(job, "REDISCLI_AUTH")],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
        "readinessProbe": {"exec": {"command": [
            "sh", "-c", f"{cli} --user {REDIS_USER} ping | grep -q PONG"]},
                           "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": REDIS_PORT}, "periodSeconds": 10,
                          "failureThreshold": 6},
        "resources": {"requests": dict(res), "limits": dict(res)},
        "securityContext": _restricted(),
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    volumes = []
    if tq.tls:  # the Secret's certificate files, readable by the pod's group (fsGroup)
        container["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR,
                                          "readOnly": True})
        volumes.append({"name": "tls", "secret": {
            "secretName": secret_name(name), "defaultMode": 0o440,
            "items": [{"key": k, "path": k} for k in TLS_KEYS.values()]}})
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
        volumes.append({"name": "data", "emptyDir": {}})
    else:
        spec["volumeClaimTemplates"] = [{
            "metadata": {"name": "data", "labels": labels(name, "storage")},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": tq.redis.storage_size}}},
        }]
    if volumes:
        pod_spec["volumes"] = volumes
    node_loss_tolerations(job, pod_spec)
    with_overrides(job, "storage", spec["template"]["metadata"], pod_spec, ("redis",))
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


def build_tq_deployment(job: RLJob) -> dict:
    """TransferQueue controller and the workflow driver, one pod: the driver
    releases prompts into this controller, and both hold only in-memory state
    that must restart together."""
    name = job.metadata.name
    tq = job.spec.transfer_queue
    vols, mounts = _volumes(job, shm=False)
    # the health service alone on its plain-text port: the kubelet's probe speaks no TLS
    grpc_probe = {"grpc": {"port": HEALTH_PORT}, "periodSeconds": 5}
    tq_argv = worker_argv("transferqueue", listen=listen_address(TQ_PORT), job=name,
                          redis=redis_urls(job), password_env=PASSWORD_ENV,
                          lease_seconds=tq.lease_seconds, metrics_port=METRICS_PORT,
                          health_port=HEALTH_PORT)
    driver_argv = worker_argv("driver", job=JOB_FILE, tq=local_address(TQ_PORT),
                              weights=weights_address(job), metrics_port=DRIVER_METRICS_PORT,
                              stay=True)
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
    template_meta = {"labels": labels(name, "transferqueue")}
    pod_spec = {
        "containers": [controller, driver],
        "volumes": vols,
        "securityContext": _non_root_pod(),
        "enableServiceLinks": False,
    }
    node_loss_tolerations(job, pod_spec)
    with_overrides(job, "transferqueue", template_meta, pod_spec, ("transferqueue", "driver"))
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(job, tq_name(name), "transferqueue"),
        "spec": {
            "replicas": 1,
            # never two controllers for one table
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector(name, "transferqueue")},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }
