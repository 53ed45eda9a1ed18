"""What the operator, `rljob run` and the workers agree on, written once: the names
and labels of a job's objects, the ports its processes serve on, the environment
variables they read, and the preflight container's name and exit code.

A plain module of constants (no imports): every layer can read it, from the
TransferQueue client to the operator, without loading anything else."""

from __future__ import annotations

# labels and annotations of a job's children
MANAGED_BY = "rljob-operator"
LABEL_NAME = "rljob.dev/name"
LABEL_ROLE = "rljob.dev/role"
LABEL_REPLICA = "rljob.dev/replica"
LABEL_RANK = "rljob.dev/rank"
ANNOTATION_GANG_RESTART = "rljob.dev/gang-restart"

# ports
TQ_PORT = 50051  # the TransferQueue controller's gRPC
WEIGHTS_PORT = 50052  # trainer rank 0 serves weights
MASTER_PORT = 29500  # the trainer gang's torch.distributed rendezvous
METRICS_PORT = 9090  # a worker's Prometheus metrics
DRIVER_METRICS_PORT = 9091  # the workflow driver's, beside the controller in its pod
REDIS_PORT = 6379
# the controller's gRPC health service alone, in plain text: the kubelet's gRPC probe
# speaks no TLS
HEALTH_PORT = 50053

# environment
PASSWORD_ENV = "RLJOB_TQ_PASSWORD"  # the storage units' password (never in a URL)
# the job's token: every gRPC server of the job (TransferQueue controller, its storage
# service, the weight server) serves only callers that present it (infra/auth.py)
TOKEN_ENV = "RLJOB_JOB_TOKEN"
# the job's TLS (transferQueue.tls, infra/tls.py): its CA certificate (every process
# trusts it alone), and the server certificate and key its servers present (PEM text)
TLS_CA_ENV = "RLJOB_TLS_CA"
TLS_CERT_ENV = "RLJOB_TLS_CERT"
TLS_KEY_ENV = "RLJOB_TLS_KEY"
# their files, in the job's Secret and where redis-server reads them
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
# the storage units' Redis ACL user (unset: Redis's default user, as a Redis a user runs
# with only a requirepass has); the operator's units admit this user alone
REDIS_USER_ENV = "RLJOB_TQ_USER"
REDIS_USER = "rljob"
# every command the storage units' clients send (transferqueue/storage/redis_unit.py,
# transferqueue/journal.py, units.py's ping), as Redis ACL names: the units' user may
# run these and nothing else (no FLUSHALL, CONFIG, DEBUG, KEYS, MONITOR)
REDIS_COMMANDS = ("ping", "get", "set", "mget", "mset", "expire", "incrby", "unlink", "del",
                  "rename", "scan", "lrange", "rpush", "watch", "unwatch", "multi", "exec",
                  "discard", "evalsha", "script|load")
# set by `rljob run` for its workers: each ends soon after its parent (infra/lifeline.py);
# a worker a user starts by hand (in the background of a shell that exits) lives on
LIFELINE_ENV = "RLJOB_DIE_WITH_PARENT"

# what a role's podTemplate may not touch in the pods the operator builds (its
# containers, volumes, mount paths, ports, environment and labels); a unit test checks
# that every pod the builders make stays within these names
OWN_CONTAINERS = ("trainer", "rollout", "reward", "transferqueue", "driver", "redis",
                  "preflight")
OWN_VOLUMES = ("job", "models", "data", "dshm", "checkpoints", "tls", "ascend-driver",
               "ascend-dcmi", "npu-smi", "ascend-install-info", "reward-models")
OWN_MOUNT_PATHS = ("/etc/rljob", "/etc/rljob-tls", "/models", "/data", "/dev/shm", "/checkpoints",
                   "/usr/local/Ascend/driver", "/usr/local/dcmi", "/usr/local/bin/npu-smi",
                   "/etc/ascend_install.info", "/reward-models")
OWN_PORTS = (TQ_PORT, WEIGHTS_PORT, MASTER_PORT, METRICS_PORT, DRIVER_METRICS_PORT, REDIS_PORT,
             HEALTH_PORT)
OWN_ENV_PREFIX = "RLJOB_"
OWN_ENV = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "RANK", "WORLD_SIZE",
           "NPROC_PER_NODE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "POD_NAME", "POD_NAMESPACE",
           "PYTHONUNBUFFERED", "REDISCLI_AUTH", "WANDB_API_KEY", "HCCL_IF_IP",
           "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_SOCKET_IFNAME",
           "GLOO_SOCKET_IFNAME", "HCCL_IF_BASE_PORT")
OWN_KEY_PREFIX = "rljob.dev/"  # labels and annotations
OWN_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance",
              "app.kubernetes.io/component", "app.kubernetes.io/part-of",
              "app.kubernetes.io/managed-by")
OWN_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/queue-name")
# spec.managedBy: unset or this value, the operator reconciles the job; another
# controller's name (e.g. kueue.x-k8s.io/multikueue) leaves it to that controller
OPERATOR_MANAGER = "rljob.dev/operator"

# the live profile the trainer reports to the controller for the operator's autoscaler:
# the record of a trainer life's last LIVE_PROFILE_STEPS steps, its first
# LIVE_PROFILE_SKIP (start-up: compilation, the first weights) aside, so the first
# record comes with the life's step LIVE_PROFILE_SKIP + 1
LIVE_PROFILE_STEPS, LIVE_PROFILE_SKIP = 20, 3

# the trainer's init container (`rljob worker preflight`): it exits EXIT_PROBLEMS
# with the job's problems in its termination message, which the operator reports
PREFLIGHT_CONTAINER = "preflight"
EXIT_PROBLEMS = 3


def operator_manages(managed_by: str | None) -> bool:
    """Whether this operator runs a job whose spec.managedBy is `managed_by` (pure)."""
    return managed_by in (None, OPERATOR_MANAGER)


def listen_address(port: int) -> str:
    """A server's listen address on every interface (pure)."""
    return f"0.0.0.0:{port}"


def local_address(port: int) -> str:
    """The address of a server on this host (pure)."""
    return f"127.0.0.1:{port}"


# `rljob worker ROLE`'s flags, by their Python names (max_steps is --max-steps); the
# CLI's parser takes exactly these (a unit test compares them with its commands)
WORKER_FLAGS = {
    "transferqueue": ("listen", "job", "redis", "memory_units", "password_env",
                      "lease_seconds", "max_row_bytes", "metrics_port", "health_port", "log_level"),
    "driver": ("job", "tq", "weights", "run_dir", "start_step", "max_steps", "metrics_port",
               "stay"),
    "rollout": ("job", "tq", "weights", "replica", "run_dir", "metrics_port"),
    "reward": ("job", "tq", "replica", "run_dir", "metrics_port"),
    "trainer": ("job", "tq", "weights_listen", "rank", "world_size", "master", "run_dir",
                "resume", "max_steps", "metrics_port"),
    "preflight": ("job", "termination_log"),
}


def worker_argv(role: str, **flags) -> list[str]:
    """`rljob worker ROLE ...`'s arguments after `rljob` (pure): each flag by its
    Python name; True gives the bare flag, False and None leave it out, a list or
    tuple repeats it once per item. A flag the worker does not take is a ValueError
    (the pods and `rljob run` start workers only through this)."""
    if role not in WORKER_FLAGS:
        raise ValueError(f"no worker {role!r}: one of {', '.join(WORKER_FLAGS)}")
    unknown = sorted(set(flags) - set(WORKER_FLAGS[role]))
    if unknown:
        raise ValueError(f"rljob worker {role} takes no {', '.join(unknown)}")
    argv = ["worker", role]
    for name in WORKER_FLAGS[role]:  # in the table's order: the same flags, the same argv
        value = flags.get(name)
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv
