"""`spec.podTemplateOverrides`: what a platform team adds to the pods of some of the
job's roles (trainer, rollout, transferqueue, storage): labels and annotations, node
selector, tolerations, affinity, volumes, image pull secrets, a service account,
scheduling gates, sidecars and init containers, and environment variables and mounts
of the roles' own containers. A list, applied in order, each naming its roles.

The operator's own pieces stay its own: the rules below refuse an override that
names one of its containers, volumes, mount paths, ports, environment variables or
label keys (`rljob.contract`), in `rljob validate` and at `kubectl apply` alike.
Objects Kubernetes defines at length (a volume's source, affinity, the rest of a
container) pass through as written; the fields the rules read are typed."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from rljob.contract import (
    OWN_ANNOTATIONS,
    OWN_CONTAINERS,
    OWN_ENV,
    OWN_ENV_PREFIX,
    OWN_KEY_PREFIX,
    OWN_LABELS,
    OWN_MOUNT_PATHS,
    OWN_PORTS,
    OWN_VOLUMES,
)

from ..base import ApiModel, Rule
from .common import DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN

LIST = 16  # items of each list at most (bounds the apiserver's cost of the rules)
ROLES = ("trainer", "rollout", "reward", "transferqueue", "storage")  # rljob.dev/role labels
WHERE = "podTemplateOverrides[]"


def _cel(values) -> str:
    """A CEL list literal."""
    return "[" + ", ".join(repr(v) if isinstance(v, str) else str(v) for v in values) + "]"


def own_path(path: str) -> bool:
    """Whether a mount path is, or lies under, one of the operator's (pure)."""
    return any(path == p or path.startswith(p + "/") for p in OWN_MOUNT_PATHS)


_OWN_PATH_CEL = (f"(m.mountPath in {_cel(OWN_MOUNT_PATHS)} || "
                 f"{_cel(OWN_MOUNT_PATHS)}.exists(p, m.mountPath.startsWith(p + '/')))")


class OpenModel(ApiModel):
    """A Kubernetes object passed through as written: the fields the rules read are
    typed, the rest is kept (x-kubernetes-preserve-unknown-fields)."""

    model_config = ConfigDict(extra="allow")


class EnvVar(OpenModel):
    """An environment variable, as in a container (value or valueFrom)."""

    name: str = Field(..., min_length=1, max_length=256, description="Variable name.")


class VolumeMount(OpenModel):
    """A mount, as in a container (readOnly, subPath, ... pass through)."""

    name: str = Field(..., max_length=63, pattern=DNS_LABEL_PATTERN,
                      description="The volume's name.")
    mount_path: str = Field(..., min_length=1, max_length=1024,
                            description="Where it is mounted in the container.")


class ContainerPort(OpenModel):
    """A port, as in a container."""

    container_port: int = Field(..., ge=1, le=65535, description="The port's number.")


class Volume(OpenModel):
    """A pod volume: its name and its source (emptyDir, configMap, secret,
    persistentVolumeClaim, ...), as in a pod spec."""

    name: str = Field(..., max_length=63, pattern=DNS_LABEL_PATTERN,
                      description="The volume's name.")


class Container(OpenModel):
    """A container of the platform's, as in a pod spec (command, resources, ... pass
    through)."""

    name: str = Field(..., max_length=63, pattern=DNS_LABEL_PATTERN,
                      description="The container's name.")
    image: str = Field(..., min_length=1, max_length=512, description="Its image.")
    ports: list[ContainerPort] = Field(default_factory=list, max_length=LIST,
                                       description="The ports it serves on.")
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=LIST,
        description="Its mounts, of the override's spec.volumes.")


class Toleration(ApiModel):
    """A toleration, as in a pod spec."""

    key: str | None = Field(None, max_length=317, description="The taint's key.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(None, max_length=63, description="The taint's value (Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="The taint effect tolerated (unset: all).")
    toleration_seconds: int | None = Field(
        None, description="NoExecute: how long the pod stays bound after the taint.")


class LocalObjectReference(ApiModel):
    """An object of the job's namespace, by name."""

    name: str = Field(..., min_length=1, max_length=253, description="Its name.")


class PodTemplateMetadata(ApiModel):
    """Labels and annotations added to the pods."""

    labels: dict[str, str] = Field(default_factory=dict, max_length=LIST,
                                   description="Labels added to the pods.")
    annotations: dict[str, str] = Field(default_factory=dict, max_length=LIST,
                                        description="Annotations added to the pods.")

    rules = (
        Rule(
            cel=f"self.labels.all(k, !k.startsWith('{OWN_KEY_PREFIX}') && "
            f"!(k in {_cel(OWN_LABELS)}))",
            message=f"keys under {OWN_KEY_PREFIX} and "
            "app.kubernetes.io/{name,instance,component,part-of,managed-by} are the "
            "operator's labels (its selectors); use another key",
            check=lambda m: not any(k.startswith(OWN_KEY_PREFIX) or k in OWN_LABELS
                                    for k in m.labels),
            field_path=".labels",
        ),
        Rule(
            cel=f"self.annotations.all(k, !k.startsWith('{OWN_KEY_PREFIX}') && "
            f"!(k in {_cel(OWN_ANNOTATIONS)}))",
            message=f"keys under {OWN_KEY_PREFIX} and "
            f"{', '.join(OWN_ANNOTATIONS)} are the operator's annotations; use another key",
            check=lambda m: not any(k.startswith(OWN_KEY_PREFIX) or k in OWN_ANNOTATIONS
                                    for k in m.annotations),
            field_path=".annotations",
        ),
    )


def _containers_rules(field: str) -> tuple[Rule, ...]:
    alias = "initContainers" if field == "init_containers" else field
    return (
        Rule(
            cel=f"self.{alias}.all(c, !(c.name in {_cel(OWN_CONTAINERS)}))",
            message=f"{', '.join(OWN_CONTAINERS)} are the operator's "
            "container names; name yours otherwise (to add environment or mounts to the "
            f"operator's containers, use {WHERE}.container)",
            check=lambda s: not any(c.name in OWN_CONTAINERS for c in getattr(s, field)),
            field_path=f".{alias}",
        ),
        Rule(
            cel=f"self.{alias}.all(c, c.ports.all(p, !(p.containerPort in "
            f"{_cel(OWN_PORTS)})))",
            message=f"ports {', '.join(map(str, OWN_PORTS))} are the "
            "operator's; serve on another port",
            check=lambda s: not any(p.container_port in OWN_PORTS
                                    for c in getattr(s, field) for p in c.ports),
            field_path=f".{alias}",
        ),
    )


class PodTemplateSpec(ApiModel):
    """What is added to the pods' spec."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, max_length=LIST,
        description="Node labels the pods must match, besides accelerator.nodeSelector (a "
        "key both name takes this value).")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=LIST,
                                          description="Tolerations added to the pods.")
    affinity: dict[str, Any] | None = Field(
        None, description="The pods' affinity (nodeAffinity, podAffinity, podAntiAffinity), "
        "as in a pod spec.")
    volumes: list[Volume] = Field(
        default_factory=list, max_length=LIST,
        description="Volumes added to the pods, for the override's container.volumeMounts "
        "and its sidecars.")
    containers: list[Container] = Field(
        default_factory=list, max_length=LIST,
        description="Sidecar containers added beside the operator's.")
    init_containers: list[Container] = Field(
        default_factory=list, max_length=LIST,
        description="Init containers, run before the operator's (before the trainer's "
        "preflight); with restartPolicy: Always, native sidecars.")
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=LIST,
        description="Secrets to pull the images with (the job's image included).")
    service_account_name: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="ServiceAccount of the pods (default: the namespace's default).")
    scheduling_gates: list[LocalObjectReference] = Field(
        default_factory=list, max_length=LIST,
        description="Scheduling gates the pods are created with (the gate's controller "
        "removes it to let a pod be scheduled).")

    rules = (
        Rule(
            cel=f"self.volumes.all(v, !(v.name in {_cel(OWN_VOLUMES)}))",
            message=f"{', '.join(OWN_VOLUMES)} are the operator's "
            "volume names; name yours otherwise",
            check=lambda s: not any(v.name in OWN_VOLUMES for v in s.volumes),
            field_path=".volumes",
        ),
        *_containers_rules("containers"),
        *_containers_rules("init_containers"),
    )


class ContainerPatch(ApiModel):
    """What is added to the roles' own containers (the transferqueue pod's two: the
    controller and the driver; the trainer's preflight init container too)."""

    env: list[EnvVar] = Field(default_factory=list, max_length=LIST,
                              description="Environment variables (value or valueFrom).")
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=LIST,
        description="Mounts of the override's spec.volumes.")

    rules = (
        Rule(
            cel=f"self.env.all(e, !e.name.startsWith('{OWN_ENV_PREFIX}') && "
            f"!(e.name in {_cel(OWN_ENV)}))",
            message=f"{OWN_ENV_PREFIX}* and the variables the "
            "operator sets (MASTER_ADDR, RANK, WORLD_SIZE, POD_NAME, ...) are its own; "
            "use another name",
            check=lambda c: not any(e.name.startswith(OWN_ENV_PREFIX) or e.name in OWN_ENV
                                    for e in c.env),
            field_path=".env",
        ),
        Rule(
            cel=f"self.volumeMounts.all(m, !{_OWN_PATH_CEL})",
            message=f"{', '.join(OWN_MOUNT_PATHS)} "
            "(and the paths under them) are the operator's mounts; mount elsewhere",
            check=lambda c: not any(own_path(m.mount_path) for m in c.volume_mounts),
            field_path=".volumeMounts",
        ),
    )


class PodTemplateOverride(ApiModel):
    """Additions to the pods of the roles it names: metadata, pod spec, and the roles'
    own containers' environment and mounts."""

    roles: list[Literal["trainer", "rollout", "reward", "transferqueue", "storage"]] = Field(
        ..., min_length=1, max_length=5,
        description="The roles whose pods it changes: trainer, rollout, reward (the reward "
        "replicas of reward.url), transferqueue (the controller and driver pod), storage "
        "(the Redis units).")
    metadata: PodTemplateMetadata = Field(default_factory=PodTemplateMetadata,
                                          description="Labels and annotations added.")
    spec: PodTemplateSpec = Field(default_factory=PodTemplateSpec,
                                  description="What is added to the pods' spec.")
    container: ContainerPatch = Field(
        default_factory=ContainerPatch,
        description="What is added to the roles' own containers.")

    rules = (
        Rule(
            cel="self.container.volumeMounts.all(m, self.spec.volumes.exists(v, v.name == "
            "m.name)) && self.spec.containers.all(c, c.volumeMounts.all(m, "
            "self.spec.volumes.exists(v, v.name == m.name))) && "
            "self.spec.initContainers.all(c, c.volumeMounts.all(m, "
            "self.spec.volumes.exists(v, v.name == m.name)))",
            message="every volumeMounts[].name must be a volume of the override's "
            "spec.volumes (to share a claim of the job's, such as the checkpoints' PVC, "
            "add a volume of your own for it); add the volume",
            check=lambda t: all(
                m.name in {v.name for v in t.spec.volumes}
                for ms in [t.container.volume_mounts,
                           *[c.volume_mounts for c in t.spec.containers],
                           *[c.volume_mounts for c in t.spec.init_containers]]
                for m in ms),
            field_path=".spec.volumes",
        ),
    )
