"""The workers' objects: the trainer gang (headless Service, Volcano PodGroup, one
pod per rank, rank 0's preflight init container), the rollout replicas' pods and the
reward replicas' (reward.url)."""

from __future__ import annotations

from typing import Any

from rljob.api import RLJob
from rljob.contract import (
    ANNOTATION_GANG_RESTART,
    LABEL_RANK,
    LABEL_REPLICA,
    MASTER_PORT,
    METRICS_PORT,
    PREFLIGHT_CONTAINER,
    WEIGHTS_PORT,
    listen_address,
    worker_argv,
)

from .common import (
    CHECKPOINT_DIR,
    JOB_FILE,
    VOLCANO_GROUP_ANNOTATION,
    VOLCANO_QUEUE_ANNOTATION,
    _accelerated_pod_security,
    _env_common,
    _hccl_env,
    _headless_service,
    _http_probe,
    _meta,
    _metrics_port,
    _requests,
    _restricted,
    _reward_key_env,
    _scheduling,
    _volumes,
    _wandb_env,
    _worker_resources,
    master_host,
    reward_pod_name,
    rollout_pod_name,
    tq_address,
    trainer_name,
    trainer_pod_name,
    volcano,
    weights_address,
    with_overrides,
)


def build_trainer_service(job: RLJob) -> dict:
    return _headless_service(job, trainer_name(job.metadata.name), "trainer",
                             {"master": MASTER_PORT, "weights": WEIGHTS_PORT,
                              "metrics": METRICS_PORT})


def build_pod_group(job: RLJob) -> dict:
    """Volcano gang: every trainer rank and the `rollout.minReplicas` replicas are
    scheduled together, or none is (replicas beyond them join the group as room
    allows: the autoscaler's)."""
    name, spec_ = job.metadata.name, job.spec
    spec: dict[str, Any] = {"minMember": spec_.trainer.num_nodes + spec_.rollout.min_replicas
                            + reward_replicas(job)}
    if spec_.scheduling.queue:
        spec["queue"] = spec_.scheduling.queue
    if spec_.scheduling.priority_class_name:
        spec["priorityClassName"] = spec_.scheduling.priority_class_name
    amounts: dict[str, int] = {}
    for role, count in (("trainer", spec_.trainer.num_nodes * spec_.trainer.npus_per_node),
                        ("rollout", spec_.rollout.min_replicas
                         * spec_.rollout.npus_per_replica)):
        resource = spec_.accelerator_for(role).resource
        if resource:
            amounts[resource] = amounts.get(resource, 0) + count
    if amounts:
        spec["minResources"] = {k: str(v) for k, v in amounts.items()}
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
    meta = _meta(job, trainer_pod_name(name, rank), "trainer", {LABEL_RANK: str(rank)},
                 annotations)
    with_overrides(job, "trainer", meta, spec, ("trainer", PREFLIGHT_CONTAINER))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


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
    # a crashed replica restarts in place: its leased rows return to the queue when the
    # lease lapses, and it fetches the latest weights first
    return _replica_pod(job, "rollout", index, container, vols,
                        rollout_pod_name(name, index))


def _replica_pod(job: RLJob, role: str, index: int, container: dict, vols: list[dict],
                 pod_name: str) -> dict:
    """A replica's bare pod (rollout, reward): restarted in place (restartPolicy
    Always), scheduled as the role's accelerator says, in the trainer's Volcano gang,
    with the role's podTemplateOverrides."""
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "containers": [container],
        "volumes": vols,
        "securityContext": _accelerated_pod_security(job, role),
        "enableServiceLinks": False,
    }
    _scheduling(job, spec, role)
    annotations = None
    if volcano(job):  # one gang with the trainer ranks (build_pod_group)
        annotations = {VOLCANO_GROUP_ANNOTATION: trainer_name(job.metadata.name)}
        if job.spec.scheduling.queue:
            annotations[VOLCANO_QUEUE_ANNOTATION] = job.spec.scheduling.queue
    meta = _meta(job, pod_name, role, {LABEL_REPLICA: str(index)}, annotations)
    with_overrides(job, role, meta, spec, (role,))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def reward_replicas(job: RLJob) -> int:
    """The reward pods the job runs: reward.replicas with reward.url, else none."""
    return job.spec.reward.replicas if job.spec.reward.streamed else 0


def build_reward_pod(job: RLJob, index: int) -> dict:
    """A reward replica: a pod that claims finished samples and scores them, with
    reward.url a CPU pod calling the service (its key, where there is one, from
    reward.url.apiKeySecret), with reward.model one serving the model on
    reward.model.npusPerReplica of the job's accelerators."""
    name = job.metadata.name
    scorer = job.spec.reward.model
    accelerated = job.spec.accelerator_for("reward").type != "cpu"
    vols, mounts = _volumes(job, shm=scorer is not None, role="reward")
    container = {
        "name": "reward",
        "image": job.spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["rljob", *worker_argv("reward", job=JOB_FILE, tq=tq_address(job),
                                          replica=index, metrics_port=METRICS_PORT)],
        "env": [*_env_common(job), *_reward_key_env(job)],
        "ports": [_metrics_port()],
        "readinessProbe": _http_probe(METRICS_PORT),
        "volumeMounts": mounts,
        "resources": _worker_resources(job, "reward", scorer.npus_per_replica if scorer
                                       else 0, job.spec.reward.resources),
        "securityContext": _restricted() if not accelerated else
        {"allowPrivilegeEscalation": False},
    }
    # a crashed replica restarts in place: its leased rows return to the task when the
    # lease lapses, and another replica (or its next life) scores them
    return _replica_pod(job, "reward", index, container, vols, reward_pod_name(name, index))
