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
    reg: Registry[type[Base]] = Registry("thing.kind", Base, "rljob.test_things")

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


PLUGIN = {
    "pyproject.toml": """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "rljob-demo-plugin"
version = "0.1"

[project.entry-points."rljob.rewards"]
response_length = "rljob_demo_plugin:response_length"
[project.entry-points."rljob.step_sinks"]
plugin_lines = "rljob_demo_plugin:plugin_lines"
[project.entry-points."rljob.claim_policies"]
newest = "rljob_demo_plugin:Newest"
[project.entry-points."rljob.rollout_engines"]
hf_copy = "rljob_demo_plugin:HFCopy"
[project.entry-points."rljob.advantage_estimators"]
broken = "rljob_demo_plugin:no_such_thing"
""",
    "rljob_demo_plugin/__init__.py": """
import json

from rljob.rollout.engine import HFEngine
from rljob.trainer.sinks import StepSink
from rljob.transferqueue.policies import ClaimPolicy, take_rows


def response_length(prompt, response, answer):
    return float(len(response))


class Lines(StepSink):
    def __init__(self, path):
        self.path = path

    def write(self, m, version):
        with open(self.path, "a") as f:
            f.write(json.dumps({"version": version, "reward": m["reward_mean"]}) + "\\n")


def plugin_lines(spec, run_dir, start, prom):
    return Lines(run_dir.root / "plugin.jsonl") if run_dir is not None else None


class Newest(ClaimPolicy):
    name = "newest"

    def pick(self, view, count, token_budget):
        return take_rows(sorted(view.indices(), reverse=True), view.rows, count, token_budget)


class HFCopy(HFEngine):
    pass
""",
}

USE_IT = """
import json, sys
from pathlib import Path

from rljob.reward import get_reward
from rljob.rollout.engine import ENGINES, HFEngine
from rljob.trainer.algorithms import ADVANTAGE_ESTIMATORS
from rljob.trainer.sinks import open_sinks
from rljob.transferqueue.controller import Controller
from rljob.transferqueue.state import ClaimRequest
from rljob.transferqueue.schema import TaskSpec, json_column
from rljob.api.spec import RLJobSpec

assert get_reward("response_length")("1+1=", "abc", "2") == 3.0
spec = RLJobSpec.model_validate({"model": {"path": "m"}, "dataset": {"path": "d.jsonl"}})
run = Path(sys.argv[1])
sinks = open_sinks(spec, run, 0, None)
sinks.write({"step": 1, "reward_mean": 0.5}, 1)
sinks.close()
assert json.loads((run / "plugin.jsonl").read_text()) == {"version": 1, "reward": 0.5}
c = Controller(1, 10.0)
c.register([TaskSpec("driver", frozenset(), (json_column("prompt"),)),
            TaskSpec("rollout", frozenset({"prompt"}))])
c.allocate(0, 4)
c.notify_written([0, 1, 2, 3], ["prompt"])
got = c.claim(ClaimRequest("rollout", 2, policy="newest", min_count=1))
assert [r.index for r in got.rows] == [3, 2], got
assert issubclass(ENGINES.get("hf_copy"), HFEngine) and "hf_copy" in ENGINES
try:
    ADVANTAGE_ESTIMATORS.get("broken")
except ValueError as exc:
    print(exc)
"""


def test_an_installed_package_adds_a_reward_a_sink_a_claim_policy_and_an_engine(tmp_path):
    """A package installed beside rljob joins its registries by entry points: its
    reward, step sink, claim policy and rollout engine are used by name; one whose
    entry point does not load is refused in one line naming it."""
    import os

    src, site, run = tmp_path / "src", tmp_path / "site", tmp_path / "run"
    for rel, text in PLUGIN.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text.lstrip())
    run.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(site), str(src)], check=True,
                   capture_output=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    out = subprocess.run([sys.executable, "-c", USE_IT, str(run)], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert ("advantage estimator 'broken': the entry point 'rljob_demo_plugin:no_such_thing' "
            "(group rljob.advantage_estimators) fails to load: AttributeError") in out.stdout


def test_a_misspelt_name_gets_the_closest_one_offered():
    from rljob.reward import get_reward
    from rljob.transferqueue.policies import get_claim_policy
    from rljob.rollout.engine import ENGINES as ROLLOUT_ENGINES

    with pytest.raises(ValueError, match="unknown reward 'arith_partal' "
                       r'\(did you mean "arith_partial"\?\): use one of'):
        get_reward("arith_partal")
    with pytest.raises(ValueError, match=r'\(did you mean "fifo"\?\)'):
        get_claim_policy("fif0")
    with pytest.raises(ValueError, match=r'\'vlm\' is not available here \(did you mean "vllm"\?\)'):
        ROLLOUT_ENGINES.get("vlm")
    with pytest.raises(ValueError, match="'zzz' is not available here: use one of"):
        ROLLOUT_ENGINES.get("zzz")
