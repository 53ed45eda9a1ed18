"""RLJob documents shared by the unit tests (models, `rljob validate`) and the
cluster tests (the real apiserver), so both are checked against one list."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# every example job: each must validate offline, on the real apiserver and in the planner
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

TEN_LINE_YAML = """\
apiVersion: rljob.dev/v1alpha1
kind: RLJob
metadata:
  name: minimal
spec:
  model:
    path: Qwen/Qwen2.5-0.5B-Instruct
  dataset:
    path: /data/gsm8k.jsonl
"""


def minimal(name: str = "minimal") -> dict[str, Any]:
    return {
        "apiVersion": "rljob.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
                 "dataset": {"path": "/data/gsm8k.jsonl"}},
    }


def _merge(dst: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            dst.pop(key, None)
        elif isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value)
        else:
            dst[key] = value


@dataclass(frozen=True)
class Invalid:
    id: str
    patch: dict[str, Any]  # merged into minimal(); None deletes a key
    expect: str  # the problem line, as the apiserver prints it

    @property
    def said(self) -> str:
        """The line as `rljob validate` prints it: a CEL rule's without the
        apiserver's `Invalid value: "object": `."""
        return self.expect.replace(CEL_NOISE, "")

    def document(self) -> dict[str, Any]:
        doc = minimal(f"bad-{self.id}")
        _merge(doc, copy.deepcopy(self.patch))
        return doc


ASCEND = {"accelerator": {"type": "ascend"}}
CEL_NOISE = 'Invalid value: "object": '

INVALID = [
    Invalid("grpo-group-of-one", {"spec": {"algorithm": {"groupSize": 1}}},
            'spec.algorithm.groupSize: Invalid value: "object": algorithm.groupSize must be at '
            "least 2 when algorithm.name is grpo"),
    Invalid("critic-fields-in-grpo", {"spec": {"algorithm": {"gamma": 0.99}}},
            'spec.algorithm.name: Invalid value: "object": algorithm.gamma, lambda, valueClip '
            "and criticLr are the critic's"),
    Invalid("micro-batch-does-not-divide",
            {"spec": {"algorithm": {"promptsPerStep": 3, "groupSize": 4,
                                    "samplesPerMicroBatch": 5}}},
            'spec.algorithm.samplesPerMicroBatch: Invalid value: "object": '
            "algorithm.samplesPerMicroBatch must divide algorithm.promptsPerStep × "
            "algorithm.groupSize"),
    Invalid("micro-batch-old-names",
            {"spec": {"algorithm": {"globalBatchSize": 3, "groupSize": 4, "microBatchSize": 5}}},
            'spec.algorithm.samplesPerMicroBatch: Invalid value: "object": '
            "algorithm.samplesPerMicroBatch must divide algorithm.promptsPerStep × "
            "algorithm.groupSize"),
    Invalid("batch-both-names",
            {"spec": {"algorithm": {"promptsPerStep": 4, "globalBatchSize": 4}}},
            'spec.algorithm.globalBatchSize: Invalid value: "object": algorithm.globalBatchSize '
            "is the old name of algorithm.promptsPerStep"),
    Invalid("staleness-in-sync-mode", {"spec": {"workflow": {"mode": "sync", "maxStaleness": 2}}},
            'spec.workflow.maxStaleness: Invalid value: "object": workflow.maxStaleness is only '
            "allowed when workflow.mode is async"),
    Invalid("interrupt-in-periodic-mode",
            {"spec": {"workflow": {"mode": "periodic", "weightUpdate": "interrupt"}}},
            'spec.workflow.weightUpdate: Invalid value: "object": workflow.weightUpdate '
            "interrupt is only allowed when workflow.mode is async"),
    Invalid("keep-cache-without-interrupt",
            {"spec": {"workflow": {"mode": "async", "interruptCache": "keep"}}},
            'spec.workflow.interruptCache: Invalid value: "object": workflow.interruptCache '
            "keep applies to weightUpdate interrupt only"),
    Invalid("replicas-below-min", {"spec": {"rollout": {"replicas": 2, "minReplicas": 3}}},
            'spec.rollout.replicas: Invalid value: "object": rollout.replicas must be at least '
            "rollout.minReplicas"),
    Invalid("replicas-above-max", {"spec": {"rollout": {"replicas": 5, "maxReplicas": 4}}},
            'spec.rollout.replicas: Invalid value: "object": rollout.replicas must be at most '
            "rollout.maxReplicas"),
    Invalid("autoscaling-without-max", {"spec": {"rollout": {"autoscaling": {"enabled": True}}}},
            'spec.rollout.maxReplicas: Invalid value: "object": rollout.maxReplicas is required '
            "when rollout.autoscaling.enabled is true"),
    Invalid("npus-not-multiple-of-tp",
            {"spec": {"rollout": {"tensorParallel": 4, "npusPerReplica": 6}}},
            'spec.rollout.npusPerReplica: Invalid value: "object": rollout.npusPerReplica must '
            "be a multiple of rollout.tensorParallel"),
    Invalid("tp-needs-megatron",
            {"spec": {**ASCEND, "trainer": {"npusPerNode": 8, "parallelism": {"tp": 2}}}},
            'spec.trainer.parallelism: Invalid value: "object": trainer.parallelism.tp above 1 '
            "needs trainer.engine: megatron"),
    Invalid("pp-not-supported",
            {"spec": {**ASCEND, "trainer": {"engine": "megatron", "npusPerNode": 8,
                                            "parallelism": {"tp": 2, "pp": 2}}}},
            'spec.trainer.parallelism: Invalid value: "object": trainer.parallelism.pp above 1 '
            "is not supported: the trainer runs tensor and data parallelism only; set pp: 1"),
    Invalid("parallelism-does-not-divide",
            {"spec": {**ASCEND, "trainer": {"engine": "megatron", "npusPerNode": 6,
                                            "parallelism": {"tp": 4}}}},
            'spec.trainer.parallelism: Invalid value: "object": trainer.parallelism.tp × '
            "trainer.parallelism.pp must divide trainer.numNodes × trainer.npusPerNode"),
    Invalid("megatron-on-cpu", {"spec": {"trainer": {"engine": "megatron"}}},
            'spec.trainer.engine: Invalid value: "object": trainer.engine megatron needs '
            "accelerator.type ascend or gpu"),
    Invalid("packing-on-megatron",
            {"spec": {**ASCEND, "trainer": {"engine": "megatron", "packing": "sequences"}}},
            'spec.trainer.packing: Invalid value: "object": trainer.packing needs '
            "trainer.engine: torch"),
    Invalid("lora-on-megatron",
            {"spec": {**ASCEND, "trainer": {"engine": "megatron"}, "model": {"lora": {}}}},
            'spec.model.lora: Invalid value: "object": model.lora is trained by '
            "trainer.engine torch"),
    Invalid("lora-vllm-collective",
            {"spec": {**ASCEND, "model": {"lora": {}}, "rollout": {"engine": "vllm"},
                      "workflow": {"weightTransport": "collective"}}},
            'spec.workflow.weightTransport: Invalid value: "object": model.lora\'s updates '
            "reach vLLM over gRPC"),
    Invalid("lora-rank-zero", {"spec": {"model": {"lora": {"rank": 0}}}},
            "spec.model.lora.rank: Invalid value: 0: spec.model.lora.rank in body should be "
            "greater than or equal to 1"),
    Invalid("collective-across-kinds",
            {"spec": {**ASCEND, "workflow": {"weightTransport": "collective"},
                      "rollout": {"accelerator": {"type": "gpu"}}}},
            'spec.workflow.weightTransport: Invalid value: "object": workflow.weightTransport '
            "collective needs the trainer and the rollouts on one accelerator kind"),
    Invalid("warmup-path-without-warmup", {"spec": {"dataset": {"warmupPath": "shown.jsonl"}}},
            'spec.dataset.warmupPath: Invalid value: "object": dataset.warmupPath is read by the '
            "warm-up only, and model.warmupSteps is 0"),
    Invalid("queue-without-volcano", {"spec": {"scheduling": {"queue": "research"}}},
            'spec.scheduling.queue: Invalid value: "object": scheduling.queue needs '
            "scheduling.schedulerName: volcano"),
    Invalid("resource-name-on-cpu", {"spec": {"accelerator": {"resourceName": "huawei.com/Ascend910"}}},
            'spec.accelerator.resourceName: Invalid value: "object": accelerator.resourceName '
            "needs accelerator.type ascend or gpu"),
    Invalid("name-too-long", {"metadata": {"name": "a" * 41}},
            'Invalid value: "object": metadata.name must be at most 40 characters'),
    Invalid("unknown-mode", {"spec": {"workflow": {"mode": "fast"}}},
            'spec.workflow.mode: Unsupported value: "fast": supported values: "sync", '
            '"periodic", "async"'),
    Invalid("zero-learning-rate", {"spec": {"algorithm": {"lr": 0}}},
            "spec.algorithm.lr: Invalid value: 0: spec.algorithm.lr in body should be greater "
            "than 0"),
    Invalid("clip-ratio-above-one", {"spec": {"algorithm": {"clipRatio": 1.5}}},
            "spec.algorithm.clipRatio: Invalid value: 1.5: spec.algorithm.clipRatio in body "
            "should be less than 1"),
    Invalid("replicas-zero", {"spec": {"rollout": {"replicas": 0}}},
            "spec.rollout.replicas: Invalid value: 0: spec.rollout.replicas in body should be "
            "greater than or equal to 1"),
    Invalid("group-size-as-string", {"spec": {"algorithm": {"groupSize": "8"}}},
            'spec.algorithm.groupSize: Invalid value: "string": spec.algorithm.groupSize in '
            'body must be of type integer: "string"'),
    Invalid("missing-model", {"spec": {"model": None}},
            "spec.model: Required value"),
    Invalid("unknown-field", {"spec": {"rollout": {"replica": 3}}},
            'unknown field "spec.rollout.replica"'),
    Invalid("reward-with-space", {"spec": {"reward": {"name": "my reward"}}},
            'spec.reward.name: Invalid value: "my reward": spec.reward.name in body should match'),
    Invalid("override-takes-a-selector-label",
            {"spec": {"podTemplateOverrides": [{"roles": ["trainer"], "metadata": {
                "labels": {"rljob.dev/role": "rollout"}}}]}},
            'spec.podTemplateOverrides[0].metadata.labels: Invalid value: "object": keys under '
            "rljob.dev/ and app.kubernetes.io/{name,instance,component,part-of,managed-by} "
            "are the operator's labels (its selectors); use another key"),
    Invalid("override-takes-a-volume-name",
            {"spec": {"podTemplateOverrides": [{"roles": ["rollout"], "spec": {
                "volumes": [{"name": "dshm", "emptyDir": {}}]}}]}},
            'spec.podTemplateOverrides[0].spec.volumes: Invalid value: "object": job, models, '
            "data, dshm, checkpoints, tls, ascend-driver, ascend-dcmi, npu-smi, ascend-install-info, "
            "reward-models "
            "are the operator's volume names; name yours otherwise"),
    Invalid("override-sets-the-rank",
            {"spec": {"podTemplateOverrides": [{"roles": ["trainer"], "container": {
                "env": [{"name": "RANK", "value": "3"}]}}]}},
            'spec.podTemplateOverrides[0].container.env: Invalid value: "object": RLJOB_* and '
            "the variables the operator sets (MASTER_ADDR, RANK, WORLD_SIZE, POD_NAME, ...) "
            "are its own; use another name"),
    Invalid("override-sidecar-on-the-metrics-port",
            {"spec": {"podTemplateOverrides": [{"roles": ["rollout"], "spec": {"containers": [
                {"name": "side", "image": "busybox", "ports": [{"containerPort": 9090}]}]}}]}},
            'spec.podTemplateOverrides[0].spec.containers: Invalid value: "object": ports '
            "50051, 50052, 29500, 9090, 9091, 6379, 50053 are the operator's; serve on another port"),
    Invalid("override-mounts-a-missing-volume",
            {"spec": {"podTemplateOverrides": [{"roles": ["trainer"], "container": {
                "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}}]}},
            'spec.podTemplateOverrides[0].spec.volumes: Invalid value: "object": every '
            "volumeMounts[].name must be a volume of the override's spec.volumes"),
    Invalid("managed-by-without-a-domain", {"spec": {"managedBy": "multikueue"}},
            'spec.managedBy: Invalid value: "multikueue": spec.managedBy in body should match'),
]
