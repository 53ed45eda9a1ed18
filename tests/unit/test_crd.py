"""The generated CRD: committed copy up to date, structural, rules attached."""

from __future__ import annotations

from pathlib import Path

import yaml

from rljob.api import RLJob
from rljob.api.base import ApiModel
from rljob.api.crd import build_crd, openapi_schema, render_crd
from rljob.api.resource import TRANSITION_RULES

REPO = Path(__file__).resolve().parents[2]


def test_committed_crd_matches_the_models():
    committed = (REPO / "crds" / "rljob.yaml").read_text()
    assert committed == render_crd(), "crds/rljob.yaml is stale: run `rljob crd`"


def _nodes(schema, path="$"):
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    for path, node in _nodes(openapi_schema()):
        assert "type" in node, path
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "title", "$defs"):
            assert banned not in node, (path, banned)
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def _schema_at(schema, wire_path):
    node = schema
    for part in wire_path.split(".")[1:]:
        node = node["properties"][part]
        if node["type"] == "array":  # a list's rules are its items'
            node = node["items"]
    return node


def test_every_rule_is_a_cel_validation_on_its_object():
    schema = openapi_schema()
    expected = {}

    def walk(model, path):
        if issubclass(model, ApiModel) and model.rules:
            expected[path] = [r.cel for r in model.rules]
        for name, field in model.model_fields.items():
            for arg in getattr(field.annotation, "__args__", (field.annotation,)):
                if isinstance(arg, type) and issubclass(arg, ApiModel):
                    walk(arg, f"{path}.{field.alias or name}")

    walk(RLJob, "$")
    assert len(expected) >= 7
    for path, cels in expected.items():
        node = schema if path == "$" else _schema_at(schema, path)
        got = [v["rule"] for v in node.get("x-kubernetes-validations", [])]
        for cel in cels:
            assert cel in got, (path, cel)
    root = [v["rule"] for v in schema["x-kubernetes-validations"]]
    assert all(r.cel in root for r in TRANSITION_RULES)


def test_defaults_follow_the_models():
    schema = openapi_schema()
    spec = schema["properties"]["spec"]
    assert spec["properties"]["workflow"]["properties"]["mode"]["default"] == "async"
    redis = _schema_at(schema, "$.spec.transferQueue.redis")
    assert redis["properties"]["resources"]["default"] == {"cpu": "1", "memory": "4Gi"}
    assert "default" not in spec["properties"]["model"]  # required
    assert spec["properties"]["rollout"]["properties"]["maxReplicas"].get("default") is None


def test_subresources_and_printer_columns():
    version = build_crd()["spec"]["versions"][0]
    scale = version["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.rollout.replicas",
        "statusReplicasPath": ".status.rollout.replicas",
        "labelSelectorPath": ".status.rollout.selector",
    }
    cols = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(cols)[:6] == ["Ready", "Step", "Staleness", "Tokens/s", "Rollouts", "Age"]
    assert cols["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert {n for n, c in cols.items() if c.get("priority") == 1} == {"Mode", "Gen-s", "Train-s"}


def test_crd_fits_plain_kubectl_apply():
    # client-side apply stores the object in a 256 KiB annotation
    assert len(render_crd().encode()) < 128 * 1024
    assert yaml.safe_load(render_crd())["kind"] == "CustomResourceDefinition"
