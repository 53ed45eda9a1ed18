"""A job's objects as a whole: what every reconcile applies, every object of a
new job, and their YAML (`rljob render`)."""

from __future__ import annotations

import yaml

from rljob.api import RLJob

from .common import volcano
from .network import NetworkAccess, build_network_policy
from .transferqueue import (
    build_config_map,
    build_redis_service,
    build_redis_statefulset,
    build_secret,
    build_tq_deployment,
    build_tq_service,
)
from .workers import (build_pod_group, build_reward_pod, build_rollout_pod, build_trainer_pod,
                      build_trainer_service, reward_replicas)


def build_services(job: RLJob, access: NetworkAccess = NetworkAccess()) -> list[dict]:
    """The long-lived children applied on every reconcile (not the Secret:
    its password is generated once; not pods: they are created one by one), with the
    job's NetworkPolicy where `access` asks for one."""
    objs = [
        build_config_map(job),
        build_redis_service(job),
        build_redis_statefulset(job),
        build_tq_service(job),
        build_tq_deployment(job),
        build_trainer_service(job),
    ]
    if access.enabled:
        objs.append(build_network_policy(job, access))
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


def build_all(job: RLJob, password: str, trainer_restarts: int = 0,
              token: str | None = None, access: NetworkAccess = NetworkAccess(),
              tls: dict[str, str] | None = None) -> list[dict]:
    """Every object of a freshly created job, in creation order (its Secret with
    `password`, `token` (the password again where none is given) and the `tls`
    certificates, if any)."""
    return [
        build_secret(job, password, password if token is None else token, tls),
        *build_services(job, access),
        *[build_trainer_pod(job, r, trainer_restarts) for r in range(job.spec.trainer.num_nodes)],
        *[build_rollout_pod(job, i) for i in range(job.spec.rollout.replicas)],
        *[build_reward_pod(job, i) for i in range(reward_replicas(job))],
    ]
