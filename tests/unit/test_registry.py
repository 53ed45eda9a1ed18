"""Extension points by registration: backends join by decorator, the registry
refuses strangers and second registrations, and the worker modules bring in the
backends they offer (the base modules import none)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rljob.infra.registry import Registry


class Base:
    pass


def test_a_registry_takes_subclasses_once_and_names_the_choices():
    reg: Registry[type[Base]] = Registry("thing.kind", Base)

    @reg.register("a")
    class A(Base):
        pass

    assert reg.get("a") is A and "a" in reg and list(reg) == ["a"]
    assert reg.register("a")(A) is A  # the same class again (a module reloaded) is fine
    with pytest.raises(ValueError, match="thing.kind 'a' is registered already"):
        reg.register("a")(type("B", (Base,), {}))
    with pytest.raises(TypeError, match="is not a Base"):
        reg.register("c")(int)
    with pytest.raises(ValueError, match="thing.kind 'z' is not available here: use one of a"):
        reg.get("z")


def test_the_workers_register_every_engine_the_spec_offers():
    from rljob.api.spec import RolloutSpec, TrainerSpec
    from rljob.rollout.engine import ENGINES
    from rljob.rollout.worker import RolloutWorker  # noqa: F401 - the composition root
    from rljob.trainer.policy import TRAINER_ENGINES
    from rljob.trainer.worker import TrainerWorker  # noqa: F401

    def choices(model, field):
        return set(model.model_fields[field].annotation.__args__)

    assert set(ENGINES) == choices(RolloutSpec, "engine") == {"hf", "vllm"}
    assert set(TRAINER_ENGINES) == choices(TrainerSpec, "engine") == {"torch", "megatron"}


def test_base_modules_import_no_backend():
    code = ("import sys, rljob.rollout.engine, rljob.trainer.policy; "
            "print('rljob.rollout.vllm_engine' in sys.modules, "
            "'rljob.trainer.mcore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["False", "False"]


def test_storage_backends_join_by_decorator_and_an_unknown_one_is_named():
    from rljob.transferqueue.storage import BACKENDS, StorageUnit, connect, register_backend
    from rljob.transferqueue.storage.memory import RemoteMemoryUnit
    from rljob.transferqueue.storage.redis_unit import RedisUnit

    assert set(BACKENDS) == {"memory", "redis"}
    assert BACKENDS.get("redis") is RedisUnit and BACKENDS.get("memory") is RemoteMemoryUnit
    with pytest.raises(ValueError, match="storage backend 'redis' is registered already"):
        register_backend("redis")(type("Other", (StorageUnit,), {}))
    with pytest.raises(TypeError, match="is not a StorageUnit"):
        register_backend("plain")(dict)
    with pytest.raises(ValueError, match="storage backend 'etcd' is not available here: "
                                         "use one of memory, redis"):
        connect("etcd", "etcd://x")
