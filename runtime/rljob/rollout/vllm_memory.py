"""A vLLM replica's memory plan (rollout.memoryUtilization): the job's model sized
from its config.json against the rollout device's memory, as vLLM's platform reports
it (the arithmetic itself is `memory.py`'s, pure)."""

from __future__ import annotations

from ..inputs.models import model_config


def memory_plan(model_spec, rollout_spec, accelerator: str, device_bytes: float | None = None):
    """A rollout device's budget for this job (`rollout.memory.rollout_memory`): vLLM's
    share is `rollout.memoryUtilization` or what the arithmetic leaves after a weight
    update's buffers and the runtime's (pure but for reading config.json). None on CPU
    or without a config.json to size from. `device_bytes`: the device's memory (the
    datasheet's for the accelerator type when not given)."""
    from .memory import for_rollout
    from ..weights.collective import BUCKET_BYTES

    cfg = model_config(model_spec) if accelerator != "cpu" else None
    if cfg is None:
        return None
    return for_rollout(cfg, model_spec.dtype, rollout_spec, accelerator, BUCKET_BYTES,
                       device_bytes)


def device_memory(accelerator: str) -> float | None:
    """The rollout device's memory as vLLM's platform reads it without initialising the
    device in this process (NVML on NVIDIA); None where the platform does not say
    (vllm-ascend 0.23.0 refuses to, so that torch_npu is initialised once, in the
    workers: vllm_ascend/platform.py:275-281)."""
    if accelerator == "cpu":
        return None
    try:
        from vllm.platforms import current_platform

        return float(current_platform.get_device_total_memory(0))
    except Exception:  # noqa: BLE001 - NotImplementedError, no NVML: the datasheet's
        return None
