"""The RLJob contract: models, defaults, rules and offline validation."""

from __future__ import annotations


import pytest
import yaml
from pydantic import ValidationError

from rljob.api import RLJob, transition_failures
from rljob.api.base import ApiModel
from rljob.api.validation import (
    RLJobError,
    YamlLoader,
    check_document,
    check_text,
    load_rljob,
)
from tests.cases import EXAMPLES, INVALID, REPO, TEN_LINE_YAML, minimal



def test_ten_line_yaml_is_valid_with_defaults():
    assert len(TEN_LINE_YAML.splitlines()) <= 10
    assert check_text(TEN_LINE_YAML, "minimal.yaml") == []
    job = RLJob.model_validate(yaml.load(TEN_LINE_YAML, Loader=YamlLoader))
    spec = job.spec
    assert spec.algorithm.name == "grpo" and spec.algorithm.group_size == 8
    assert spec.workflow.mode == "async" and spec.workflow.staleness_bound == 1
    assert spec.rollout.replicas == 1 and spec.rollout.max_replicas is None
    assert spec.accelerator.resource is None
    assert spec.model.tokenizer_path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert spec.transfer_queue.redis.resources.memory == "4Gi"


def test_wire_form_round_trips():
    job = RLJob.model_validate(minimal())
    wire = job.to_wire()
    assert wire["spec"]["rollout"]["autoscaling"]["cooldownSeconds"] == 300
    assert wire["spec"]["transferQueue"]["leaseSeconds"] == 60
    assert RLJob.model_validate(wire) == job


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path):
    job = load_rljob(str(path))
    assert job.metadata.name


def test_examples_cover_the_three_modes():
    modes = {load_rljob(str(p)).spec.workflow.mode for p in EXAMPLES}
    assert modes == {"async", "periodic"} | ({"sync"} & modes)
    ascend = load_rljob(str(REPO / "examples" / "grpo-qwen2.5-7b-ascend.yaml")).spec
    npus = ascend.rollout.replicas * ascend.rollout.npus_per_replica + ascend.trainer.world_size
    assert npus == 16 and ascend.accelerator.resource == "huawei.com/Ascend910"


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_documents_are_rejected_offline(case):
    problems = [p.text for p in check_document(case.document())]
    assert problems, f"{case.id} was accepted"
    assert any(case.said in p for p in problems), problems


@pytest.mark.parametrize("case", [c for c in INVALID if '"object"' in c.expect],
                         ids=lambda c: c.id)
def test_models_enforce_the_same_rules(case):
    message = case.expect.split('"object": ', 1)[1]
    with pytest.raises(ValidationError) as err:
        RLJob.model_validate(case.document())
    assert message in str(err.value)


def test_several_rule_failures_are_all_reported():
    doc = minimal()
    doc["spec"]["algorithm"] = {"groupSize": 1}
    doc["spec"]["workflow"] = {"mode": "sync", "maxStaleness": 2}
    doc["spec"]["scheduling"] = {"queue": "q"}
    problems = [p.text for p in check_document(doc)]
    assert [p.split(":")[0] for p in problems] == [
        "spec.algorithm.groupSize", "spec.workflow.maxStaleness", "spec.scheduling.queue"]


def test_a_rule_that_reads_a_field_already_said_wrong_is_not_said_too():
    doc = minimal()  # 16 prompts × 1 does not divide into micro-batches of 32 either
    doc["spec"]["algorithm"] = {"groupSize": 1, "promptsPerStep": 16,
                                "samplesPerMicroBatch": 32}
    problems = [p.text for p in check_document(doc)]
    assert len(problems) == 1 and problems[0].startswith("spec.algorithm.groupSize: "), problems
    doc["spec"]["algorithm"]["groupSize"] = 3  # a fault of its own: said
    problems = [p.text for p in check_document(doc)]
    assert [p.split(":")[0] for p in problems] == ["spec.algorithm.samplesPerMicroBatch"]


@pytest.mark.parametrize(
    "text, expect",
    [
        ("spec: [unclosed", "malformed YAML: line 1"),
        ("", "no YAML documents found"),
        ("- 1\n- 2\n", "document 1 is a array, not an RLJob object"),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", "kind 'Pod' is not an RLJob"),
        ("apiVersion: rljob.dev/v1\nkind: RLJob\n", "apiVersion 'rljob.dev/v1' is not served"),
        ("kind: RLJob\n", "apiVersion not set"),
    ],
)
def test_bad_input_gets_a_clear_message(text, expect):
    problems = check_text(text, "f.yaml")
    assert problems and expect in problems[0].text, problems


def test_missing_name_is_reported():
    doc = minimal()
    del doc["metadata"]["name"]
    assert any("metadata.name: Required value" in p.text for p in check_document(doc))


def test_yaml_floats_are_read_as_kubernetes_reads_them():
    assert yaml.load("lr: 1e-6", Loader=YamlLoader) == {"lr": 1e-6}
    assert yaml.load("lr: 3.0e-4", Loader=YamlLoader) == {"lr": 3e-4}
    assert yaml.load("v: 12", Loader=YamlLoader) == {"v": 12}


def test_load_rljob_raises_with_every_problem(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(TEN_LINE_YAML + "  rollout:\n    replicas: 0\n    engine: tgi\n")
    with pytest.raises(RLJobError) as err:
        load_rljob(str(f))
    text = str(err.value)
    assert "spec.rollout.replicas" in text and 'Unsupported value: "tgi"' in text
    with pytest.raises(RLJobError, match="cannot read"):
        load_rljob(str(tmp_path / "missing.yaml"))


def _running(trainer_nodes: int = 1, suspend: bool = False) -> RLJob:
    doc = minimal()
    doc["spec"]["trainer"] = {"numNodes": trainer_nodes}
    doc["spec"]["suspend"] = suspend
    doc["status"] = {"startTime": "2026-11-22T00:00:00Z"}
    return RLJob.model_validate(doc)


def test_trainer_shape_is_immutable_while_running():
    running = _running()
    changed = running.model_copy(update={"spec": _running(trainer_nodes=2).spec})
    assert [r.message for r in transition_failures(running, changed)] == [
        "spec.trainer is immutable while the job runs: set spec.suspend: true, "
        "then change the trainer shape"
    ]
    suspended = _running(suspend=True)
    assert transition_failures(suspended, changed) == []
    not_started = RLJob.model_validate(minimal())
    assert transition_failures(not_started, changed) == []


def test_every_model_has_camel_case_aliases_and_forbids_extras():
    from rljob.api.spec.pods import OpenModel

    seen = set()

    def walk(model: type[ApiModel]):
        if model in seen:
            return
        seen.add(model)
        # Kubernetes objects a podTemplate passes through keep what they do not type
        assert model.model_config["extra"] == ("allow" if issubclass(model, OpenModel)
                                               else "forbid"), model
        for name, field in model.model_fields.items():
            alias = field.alias or name
            assert "_" not in alias, (model, alias)
            for arg in getattr(field.annotation, "__args__", (field.annotation,)):
                if isinstance(arg, type) and issubclass(arg, ApiModel):
                    walk(arg)

    walk(RLJob)
    assert len(seen) > 15
