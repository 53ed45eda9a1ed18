"""The job reference page (docs/reference/job.md), generated from the CRD's schema,
which the spec models generate: one table a section, every field with its type,
default and description. `python -m rljob.api.reference` prints it; a test checks
the committed page is what this prints and that no field lacks a description."""

from __future__ import annotations

import json
from typing import Any

HEADER = """# Job reference

Every field of an `RLJob`'s `spec`, generated from the models that validate it
(`runtime/rljob/api/spec/`): the same text as `kubectl explain rljob.spec` and
`rljob validate`. Defaults apply where a field is left out; `rljob run` reads the same
YAML as the operator does. Cross-field rules are listed under their section.
"""


def _type(node: dict[str, Any]) -> str:
    kind = node.get("type", "")
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if kind == "array":
        return f"list of {_type(node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of {_type(node['additionalProperties'])}"
    bounds = []
    if "minimum" in node:
        bounds.append((">" if node.get("exclusiveMinimum") else "≥") + f" {node['minimum']}")
    if "maximum" in node:
        bounds.append(("<" if node.get("exclusiveMaximum") else "≤") + f" {node['maximum']}")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _default(node: dict[str, Any]) -> str:
    if "default" not in node or node.get("type") == "object" and node.get("properties"):
        return ""
    return f"`{json.dumps(node['default'], ensure_ascii=False)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def heading(path: str) -> str:
    """The heading of `path`'s section (pure): its own name, at the depth of its
    nesting (## for spec, ### for spec.model, ...), so the page's contents list names
    each object and nests it under its parent; the anchor stays the whole path's."""
    parts = path.split(".")
    return f"{'#' * (len(parts) + 1)} `{parts[-1]}` {{#{_anchor(path)}}}"


def _sections(node: dict[str, Any], path: str, out: list[str]) -> None:
    props = node.get("properties", {})
    required = set(node.get("required", []))
    out.append(f"\n{heading(path)}\n")
    if "." in path:
        out.append(f"`{path}`\n")
    if node.get("description"):
        out.append(_cell(node["description"]) + "\n")
    out.append("| field | type | default | description |")
    out.append("|---|---|---|---|")
    nested = []
    for key, sub in props.items():
        name = f"`{key}`" + (" (required)" if key in required else "")
        if sub.get("type") == "object" and sub.get("properties"):
            nested.append((key, sub))
            name = f"[`{key}`](#{_anchor(f'{path}.{key}')})" + (
                " (required)" if key in required else "")
            kind = "object"
        elif sub.get("type") == "array" and sub.get("items", {}).get("properties"):
            nested.append((f"{key}[]", sub["items"]))
            name = f"[`{key}`](#{_anchor(f'{path}.{key}[]')})"
            kind = "list of objects"
        else:
            kind = _type(sub)
        out.append(f"| {name} | {kind} | {_default(sub)} | {_cell(sub.get('description', ''))} |")
    rules = node.get("x-kubernetes-validations", [])
    if rules:
        out.append("\nRules:\n")
        out.extend(f"- {_cell(r['message'])}" for r in rules)
    for key, sub in nested:
        _sections(sub, f"{path}.{key}", out)


def _anchor(path: str) -> str:
    """The anchor MkDocs gives a heading `path` (its toc slugify)."""
    return "".join(c for c in path.lower() if c.isalnum() or c in "-_")


def undescribed(node: dict[str, Any], path: str = "spec") -> list[str]:
    """The fields under `node` (a CRD schema node) without a description."""
    missing = []
    for key, sub in node.get("properties", {}).items():
        here = f"{path}.{key}"
        if not sub.get("description"):
            missing.append(here)
        missing.extend(undescribed(sub, here))
        if isinstance(sub.get("items"), dict):
            missing.extend(undescribed(sub["items"], here + "[]"))
        if isinstance(sub.get("additionalProperties"), dict):
            missing.extend(undescribed(sub["additionalProperties"], here + "{}"))
    return missing


def job_reference(spec_schema: dict[str, Any]) -> str:
    """The reference page of `spec_schema` (the CRD's spec node)."""
    out = [HEADER]
    _sections(spec_schema, "spec", out)
    return "\n".join(out) + "\n"


def main() -> None:
    from .crd import openapi_schema

    print(job_reference(openapi_schema()["properties"]["spec"]), end="")


if __name__ == "__main__":
    main()
