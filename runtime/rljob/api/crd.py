"""Generate the RLJob CustomResourceDefinition from the pydantic models.

The models are the single source of truth: this turns their JSON schema into a
structural OpenAPI v3 schema (no $ref, a type on every node, OpenAPI-style
exclusive bounds, defaults that the apiserver applies the way the models do)
and attaches every `Rule` as an `x-kubernetes-validations` CEL rule on the
object it belongs to.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from .base import ApiModel
from .resource import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    TRANSITION_RULES,
    VERSION,
    RLJob,
)

_DROP = {"title"}


def _model_classes(model: type[BaseModel], found: dict[str, type[BaseModel]]) -> None:
    """Map JSON-schema definition names to model classes, recursively."""
    found[model.__name__] = model
    for field in model.model_fields.values():
        for arg in _type_args(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel) and arg.__name__ not in found:
                _model_classes(arg, found)


def _type_args(tp: Any) -> list[Any]:
    args = getattr(tp, "__args__", None)
    if not args:
        return [tp]
    out = []
    for a in args:
        out.extend(_type_args(a))
    return out


def _field_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Wire defaults of fields built by default_factory (absent from JSON schema).

    Nested objects default to their full wire form, not `{}`: the apiserver
    checks CEL rules against default values without filling in their nested
    defaults, and a full default is also exactly what the models assume.
    """
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.default_factory is None:
            continue
        value = field.default_factory()
        key = field.alias or name
        if isinstance(value, ApiModel):
            out[key] = value.to_wire()
        elif isinstance(value, (dict, list)):
            out[key] = value
    return out


class _Converter:
    def __init__(self, root: type[BaseModel]):
        self.schema = root.model_json_schema(by_alias=True, mode="validation")
        self.defs: dict[str, Any] = self.schema.get("$defs", {})
        self.classes: dict[str, type[BaseModel]] = {}
        _model_classes(root, self.classes)

    def convert(self, node: dict[str, Any], model: type[BaseModel] | None = None) -> dict[str, Any]:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            merged = {**self.defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            return self.convert(merged, self.classes[name])
        if "anyOf" in node:  # Optional[X]: not required, null is pruned by the apiserver
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"unsupported union in API schema: {node}")
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            return self.convert({**options[0], **rest})

        out: dict[str, Any] = {}
        if node.get("description"):
            out["description"] = " ".join(node["description"].split())
        if "type" not in node:
            raise ValueError(f"schema node without a type: {node}")
        out["type"] = node["type"]
        for key in ("format", "enum", "pattern", "minLength", "maxLength", "minItems",
                    "maxItems", "minProperties", "maxProperties", "minimum", "maximum"):
            if key in node:
                out[key] = node[key]
        # JSON Schema 2020-12 exclusive bounds are numbers; OpenAPI v3.0 uses booleans.
        if "exclusiveMinimum" in node:
            out["minimum"], out["exclusiveMinimum"] = node["exclusiveMinimum"], True
        if "exclusiveMaximum" in node:
            out["maximum"], out["exclusiveMaximum"] = node["exclusiveMaximum"], True
        if node.get("default") is not None:
            out["default"] = node["default"]

        if node["type"] == "object":
            props = node.get("properties", {})
            factory_defaults = _field_defaults(model) if model else {}
            if props:
                out["properties"] = {}
                for key, sub in props.items():
                    conv = self.convert(sub)
                    if key in factory_defaults:
                        conv["default"] = factory_defaults[key]
                    out["properties"][key] = conv
            if node.get("required"):
                out["required"] = list(node["required"])
            extra = node.get("additionalProperties")
            if isinstance(extra, dict):
                out["additionalProperties"] = self.convert(extra)
            elif extra is True:  # a Kubernetes object passed through as written
                out["x-kubernetes-preserve-unknown-fields"] = True
            if model is not None and issubclass(model, ApiModel) and model.rules:
                out["x-kubernetes-validations"] = [r.x_kubernetes_validation() for r in model.rules]
        elif node["type"] == "array":
            out["items"] = self.convert(node["items"])
        return out


def openapi_schema() -> dict[str, Any]:
    """The structural schema of RLJob (openAPIV3Schema of the CRD version)."""
    conv = _Converter(RLJob)
    props = conv.schema["properties"]
    spec = conv.convert(props["spec"])
    spec["description"] = "What to train and how: model, data, algorithm, workflow, resources."
    status = conv.convert(props["status"])
    status["description"] = "Observed state, written by the operator (status subresource)."
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    conditions.pop("default", None)
    return {
        "type": "object",
        "description": "RLJob runs RL post-training of an LLM as a disaggregated, streaming "
        "job: a TransferQueue, rollout replicas and a trainer gang.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [
            r.x_kubernetes_validation() for r in (*RLJob.rules, *TRANSITION_RULES)
        ],
    }


PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string",
     "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Staleness", "type": "number", "jsonPath": ".status.progress.stalenessMean",
     "description": "Mean staleness of the samples trained in the last step"},
    {"name": "Tokens/s", "type": "number", "jsonPath": ".status.progress.tokensPerSecond"},
    {"name": "Rollouts", "type": "integer", "jsonPath": ".spec.rollout.replicas",
     "description": "Desired rollout replicas"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Mode", "type": "string", "jsonPath": ".spec.workflow.mode", "priority": 1},
    {"name": "Gen-s", "type": "number", "jsonPath": ".status.progress.genSeconds",
     "priority": 1, "description": "Tgen: seconds to generate one step's samples"},
    {"name": "Train-s", "type": "number", "jsonPath": ".status.progress.trainSeconds",
     "priority": 1, "description": "Ttrain: seconds of one optimizer step"},
]


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "rljob", "app.kubernetes.io/part-of": "rljob"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.rollout.replicas",
                            "statusReplicasPath": ".status.rollout.replicas",
                            "labelSelectorPath": ".status.rollout.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


HEADER = "# GENERATED by `rljob crd` from runtime/rljob/api: do not edit by hand.\n"


def render_crd() -> str:
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=100)
