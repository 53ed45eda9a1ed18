"""RLJob → Kubernetes objects, as pure functions.

The operator's handlers (`rljob_operator`) call these and create-or-patch the
result; `rljob render` prints the same objects. They live with the contract, so
the runtime never imports the operator (the operator imports the runtime). Nothing here talks to a cluster, so every
object the operator creates is unit-tested without one.

Children of RLJob NAME (deterministic names, all owned by the RLJob):

    NAME-tq-auth        Secret       generated Redis password and job token
    NAME-spec           ConfigMap    the resolved job (every default filled in)
    NAME-redis          Service      headless: stable DNS per storage unit
    NAME-redis          StatefulSet  one Redis per TransferQueue storage unit
    NAME-tq             Service      TransferQueue controller gRPC + metrics
    NAME-tq             Deployment   TransferQueue controller + workflow driver
    NAME-trainer        Service      headless: the gang's DNS (MASTER_ADDR, weights)
    NAME-trainer        PodGroup     Volcano gang (scheduling.schedulerName: volcano)
    NAME-ingress        NetworkPolicy  who may connect to the job's pods
    NAME-trainer-R      Pod          trainer rank R (one pod per node)
    NAME-rollout-I      Pod          rollout replica I (added/removed one at a time)
    NAME-reward-I       Pod          reward replica I (reward.url)

Trainer and rollout replicas are bare pods owned by the RLJob, not a
StatefulSet: the operator restarts the trainer gang as a whole (every rank
resumes from one checkpoint) and picks which rollout replica to remove.

One module per part: common.py (names, labels, addresses, pod pieces),
transferqueue.py (Secret, ConfigMap, Redis units, controller and driver),
workers.py (trainer gang, rollout and reward replicas), network.py (the NetworkPolicy),
job.py (the sets, YAML).
"""

from rljob.contract import (  # the contract's names, read here as builders.X too
    ANNOTATION_GANG_RESTART,
    DRIVER_METRICS_PORT,
    LABEL_NAME,
    LABEL_RANK,
    LABEL_REPLICA,
    LABEL_ROLE,
    HEALTH_PORT,
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

from .common import (
    ASCEND_HOST_PATHS,
    CHECKPOINT_DIR,
    JOB_DIR,
    JOB_FILE,
    PASSWORD_KEY,
    REWARD_KEY,
    TLS_KEYS,
    TOKEN_KEY,
    VOLCANO_GROUP_ANNOTATION,
    VOLCANO_QUEUE_ANNOTATION,
    WANDB_KEY,
    config_map_name,
    labels,
    master_host,
    quantity,
    redis_name,
    redis_urls,
    reward_pod_name,
    rollout_pod_name,
    secret_name,
    selector,
    selector_string,
    tq_address,
    tq_name,
    trainer_name,
    trainer_pod_name,
    volcano,
    weights_address,
)
from .job import build_all, build_services, to_yaml, with_runtime_image
from .network import NetworkAccess, build_network_policy, network_policy_name
from .transferqueue import (
    build_config_map,
    build_redis_service,
    build_redis_statefulset,
    build_secret,
    build_tq_deployment,
    build_tq_service,
    new_password,
    redis_acl_args,
    resolved_job,
)
from .workers import (
    build_pod_group,
    build_preflight_container,
    build_reward_pod,
    build_rollout_pod,
    build_trainer_pod,
    build_trainer_service,
    reward_replicas,
    trainer_command,
)

__all__ = [
    "ANNOTATION_GANG_RESTART",
    "ASCEND_HOST_PATHS",
    "CHECKPOINT_DIR",
    "DRIVER_METRICS_PORT",
    "JOB_DIR",
    "JOB_FILE",
    "LABEL_NAME",
    "LABEL_RANK",
    "LABEL_REPLICA",
    "LABEL_ROLE",
    "MANAGED_BY",
    "MASTER_PORT",
    "NetworkAccess",
    "METRICS_PORT",
    "PASSWORD_ENV",
    "PASSWORD_KEY",
    "REWARD_KEY",
    "TLS_KEYS",
    "TOKEN_KEY",
    "PREFLIGHT_CONTAINER",
    "REDIS_PORT",
    "TQ_PORT",
    "HEALTH_PORT",
    "VOLCANO_GROUP_ANNOTATION",
    "VOLCANO_QUEUE_ANNOTATION",
    "WANDB_KEY",
    "WEIGHTS_PORT",
    "build_all",
    "build_config_map",
    "build_network_policy",
    "build_pod_group",
    "build_preflight_container",
    "build_redis_service",
    "build_redis_statefulset",
    "build_reward_pod",
    "build_rollout_pod",
    "build_secret",
    "build_services",
    "build_tq_deployment",
    "build_tq_service",
    "build_trainer_pod",
    "build_trainer_service",
    "config_map_name",
    "labels",
    "listen_address",
    "local_address",
    "master_host",
    "network_policy_name",
    "new_password",
    "redis_acl_args",
    "redis_name",
    "redis_urls",
    "resolved_job",
    "quantity",
    "reward_pod_name",
    "reward_replicas",
    "rollout_pod_name",
    "secret_name",
    "selector",
    "selector_string",
    "to_yaml",
    "tq_address",
    "tq_name",
    "trainer_command",
    "trainer_name",
    "trainer_pod_name",
    "volcano",
    "weights_address",
    "with_runtime_image",
    "worker_argv",
]
