"""Offline validation of RLJob YAML with the apiserver's wording.

`kubectl apply` reports schema errors as `FIELD: Invalid value: VALUE: DETAIL`,
enum errors as `Unsupported value`, unknown fields as `unknown field "PATH"`
and CEL rules with their message. `check_documents` reports the same problems
for the same input, one line each, so a file that passes here is accepted by a
cluster with the CRD installed (and the other way round); a CEL rule's line leaves
out the apiserver's `Invalid value: "object": ` (the object is no value a user
wrote): `FIELD: MESSAGE`.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from .base import DEFER_RULES, rule_failures
from .resource import API_VERSION, KIND, RLJob


class YamlLoader(yaml.SafeLoader):
    """SafeLoader that reads `1e-6` as a float, as Kubernetes' YAML decoder does
    (PyYAML follows YAML 1.1 strictly and would read it as a string)."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


@dataclass(frozen=True)
class Problem:
    """One validation problem: where (document) and what (apiserver wording)."""

    document: int  # 1-based position in the file
    text: str  # word for word what the apiserver says
    hint: str = ""  # what only the offline check adds: a likely fix, the numbers

    @property
    def full(self) -> str:
        return f"{self.text} {self.hint}" if self.hint else self.text


class RLJobError(ValueError):
    """An RLJob document that a cluster would reject; str() lists every problem."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p.full}" for p in problems))


_KUBE_TYPES = {
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "str": "string",
    "dict": "object",
    "list": "array",
    "NoneType": "null",
}


def _wire_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return _KUBE_TYPES.get(type(value).__name__, "string")


def _quote(value: Any) -> str:
    """A value as the apiserver prints it in `Invalid value: ...`."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, int) else format(value, "g")
    return json.dumps(_wire_type(value))


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


_EXPECTED_TYPE = {
    "int_type": "integer",
    "int_from_float": "integer",
    "float_type": "number",
    "bool_type": "boolean",
    "string_type": "string",
    "dict_type": "object",
    "model_type": "object",
    "model_attributes_type": "object",
    "list_type": "array",
    "datetime_type": "string",
}
_BOUNDS = {
    "greater_than_equal": ("ge", "greater than or equal to"),
    "greater_than": ("gt", "greater than"),
    "less_than_equal": ("le", "less than or equal to"),
    "less_than": ("lt", "less than"),
}


# names peers use for our fields (TRL, verl, OpenRLHF), normalized (lowercase, no
# separators) → the field here
SYNONYMS = {
    "learningrate": "lr", "numgenerations": "groupSize", "nsamples": "groupSize",
    "n": "groupSize", "beta": "klCoef", "klcoeff": "klCoef", "initklcoef": "klCoef",
    "maxcompletionlength": "maxNewTokens", "maxresponselength": "maxNewTokens",
    "responselength": "maxNewTokens", "maxtokens": "maxNewTokens",
    "batchsize": "promptsPerStep", "trainbatchsize": "promptsPerStep",
    "globalbatchsize": "promptsPerStep", "rolloutbatchsize": "promptsPerStep",
    "ppomicrobatchsize": "samplesPerMicroBatch",
    "ppomicrobatchsizepergpu": "samplesPerMicroBatch",
    "perdevicetrainbatchsize": "samplesPerMicroBatch",
    "maxgradnorm": "maxGradNorm", "gradclip": "maxGradNorm", "cliprange": "clipRatio",
    "epsilon": "clipRatio", "totalsteps": "maxSteps", "totaltrainingsteps": "maxSteps",
    "numreplicas": "replicas", "tensorparallelsize": "tensorParallel",
    "tp": "tensorParallel", "modelpath": "path", "datasetpath": "path",
    "rewardfunction": "name", "staleness": "maxStaleness",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]", "", name).lower()


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The wire names of the fields of the object at `loc` (empty if unknown)."""
    import types
    import typing

    from pydantic import BaseModel

    model: Any = RLJob
    for part in loc:
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        field = fields.get(part)
        if field is None:
            return []
        ann = field.annotation
        args = typing.get_args(ann) if isinstance(ann, types.UnionType) or \
            typing.get_origin(ann) is typing.Union else (ann,)
        nxt = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if not nxt:
            return []
        model = nxt[0]
    return [(f.alias or n) for n, f in model.model_fields.items()]


def _all_fields(loc: tuple[Any, ...] = ("spec",)) -> list[tuple[Any, ...]]:
    """The wire paths of every field under `loc`, through nested objects (pure)."""
    out = []
    for name in _fields_at(loc):
        here = (*loc, name)
        out.append(here)
        out.extend(_all_fields(here))
    return out


def did_you_mean(loc: tuple[Any, ...]) -> str | None:
    """The field an unknown field at `loc` probably meant: in its own object, a peer's
    name for one, the same name in another case, or a near spelling; else the field of
    that name elsewhere in the spec (`spec.lr` → `spec.algorithm.lr`), as a full path."""
    import difflib

    known = _fields_at(loc[:-1])
    typed = _norm(str(loc[-1]))
    by_norm = {_norm(k): k for k in known}
    if SYNONYMS.get(typed) in known:
        return SYNONYMS[typed]
    if typed in by_norm:
        return by_norm[typed]
    close = difflib.get_close_matches(typed, list(by_norm), n=1, cutoff=0.75)
    if close:
        return by_norm[close[0]]
    if not loc or loc[0] != "spec":
        return None
    wanted = {typed, _norm(SYNONYMS.get(typed, typed))}
    elsewhere = [p for p in _all_fields() if _norm(str(p[-1])) in wanted]
    if len(elsewhere) != 1:  # none, or several: no one guess
        return None
    return _path(elsewhere[0])


def _wire_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pydantic error's loc as a wire path: pydantic names a failing union member by
    its type name, the wire path has only field names and list indices."""
    return tuple(p for p in loc if not (isinstance(p, str) and p[:1].isupper() and p != "RLJob"))


def _describe(err: dict[str, Any]) -> str:
    """One pydantic error in the apiserver's words."""
    kind, loc, value, ctx = err["type"], err["loc"], err.get("input"), err.get("ctx", {})
    loc = _wire_loc(loc)
    if loc and loc[-1] in ("[key]",):
        loc = loc[:-1]
    field = _path(loc)
    if kind == "missing":
        return f"{field}: Required value"
    if kind == "extra_forbidden":
        return f'unknown field "{field}"'
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        supported = ", ".join(json.dumps(a) for a in allowed)
        return f"{field}: Unsupported value: {_quote(value)}: supported values: {supported}"
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        bound = ctx[key]
        bound = int(bound) if float(bound).is_integer() else bound
        return f"{field}: Invalid value: {_quote(value)}: {field} in body should be {words} {bound}"
    if kind == "string_too_short":
        return (f"{field}: Invalid value: {_quote(value)}: {field} in body should be at least "
                f"{ctx['min_length']} chars long")
    if kind == "string_too_long":
        return f"{field}: Too long: may not be more than {ctx['max_length']} bytes"
    if kind == "too_long":
        return f"{field}: Too many: {ctx.get('actual_length')}: must have at most {ctx['max_length']} items"
    if kind == "string_pattern_mismatch":
        return (f"{field}: Invalid value: {_quote(value)}: {field} in body should match "
                f"'{ctx['pattern']}'")
    if kind in _EXPECTED_TYPE:
        got = _wire_type(value)
        return (f"{field}: Invalid value: {json.dumps(got)}: {field} in body must be of type "
                f"{_EXPECTED_TYPE[kind]}: {json.dumps(got)}")
    if kind == "rule":  # a cross-field rule raised during parsing (not deferred)
        return f"{field}: {err['msg']}"
    return f"{field}: Invalid value: {_quote(value)}: {err['msg']}"


def check_document(doc: Any, index: int = 1) -> list[Problem]:
    """Every problem the apiserver would report for one RLJob document."""
    if not isinstance(doc, dict):
        return [Problem(index, f"document {index} is a {_wire_type(doc)}, not an RLJob object")]
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if kind is None or api_version is None:
        missing = " and ".join(k for k in ("apiVersion", "kind") if doc.get(k) is None)
        return [Problem(index, f"document {index}: {missing} not set: an RLJob starts with "
                               f"'apiVersion: {API_VERSION}' and 'kind: {KIND}'")]
    if kind != KIND:
        return [Problem(index, f"document {index}: kind {kind!r} is not an RLJob; this checks "
                               f"kind: {KIND} documents only")]
    problems: list[Problem] = []
    if api_version != API_VERSION:  # said, and the rest checked as the served version's
        problems.append(Problem(index, f"document {index}: apiVersion {api_version!r} is not "
                                       f"served: use apiVersion: {API_VERSION}"))
        doc = {**doc, "apiVersion": API_VERSION}
    return problems + _check_served(doc, index)


def _check_served(doc: dict, index: int, removed: frozenset = frozenset()) -> list[Problem]:
    """check_document's problems of an RLJob of the served version: the schema's (the
    unknown fields first, as the apiserver's decoder), then the rules' on what is left
    once the fields that broke the schema are taken out (`removed`: (object path,
    field) pairs taken out so far, whose rules are not said again)."""
    problems: list[Problem] = []
    meta = doc.get("metadata") or {}
    if isinstance(meta, dict) and not meta.get("name") and not meta.get("generateName"):
        problems.append(Problem(index, "metadata.name: Required value: name or generateName "
                                       "is required"))
    try:
        job = _parse(doc)
    except ValidationError as exc:
        # Unknown fields are rejected by the decoder before schema validation,
        # as the apiserver does with strict field validation.
        # a field taken out for breaking the schema is not said again as missing
        errors = [e for e in exc.errors(include_url=False) if not (
            e["type"] == "missing" and _pair(e) in removed)]
        if not errors:
            return problems
        unknown = [e for e in errors if e["type"] == "extra_forbidden"]
        for err in unknown or errors:
            meant = (did_you_mean(_wire_loc(err["loc"])) if err["type"] == "extra_forbidden"
                     else None)
            problems.append(Problem(index, _describe(err),
                                    f'(did you mean "{meant}"?)' if meant else ""))
        # and what the rest of the document has wrong, in the same run: without the
        # fields said (a required one missing stays missing: nothing more to learn)
        said = [e for e in (unknown or errors) if e["type"] != "missing"]
        rest = without_fields(doc, said)
        if rest != doc:
            seen = {p.text for p in problems}
            gone = removed | {_pair(e) for e in said if _wire_loc(e["loc"])}
            problems += [p for p in _check_served(rest, index, frozenset(gone))
                         if p.text not in seen]
        return problems
    failed: set[tuple[str, str]] = set(removed)  # (object path, field) of a failure said
    for failure in rule_failures(job, ""):
        if knock_on(failure, failed):
            continue
        # a rule of the whole object (metadata.name's) names its field in its message
        where = f"{failure.field}: " if failure.field else ""
        problems.append(Problem(index, f"{where}{failure.rule.message}",
                                failure.rule.hint(failure.obj)))
        if failure.rule.field_path:
            failed.add((failure.path, failure.rule.field_path.lstrip(".")))
    return problems


def _parse(doc: dict) -> RLJob:
    """`doc` as a job, strictly, its rules not yet applied (ValidationError else)."""
    return RLJob.model_validate_json(json.dumps(doc, default=str), strict=True,
                                     context={DEFER_RULES: True})


def best_effort_job(doc: Any) -> RLJob | None:
    """The job `doc` describes with every field the schema refuses left out (their
    defaults apply) and its rules not yet applied, as the served version; None where
    it cannot be read as one (not an RLJob, or a required field missing). What the
    checks of the files see of a document whose schema problems are said already."""
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        return None
    doc = {**doc, "apiVersion": API_VERSION}
    while True:
        try:
            return _parse(doc)
        except ValidationError as exc:
            said = [e for e in exc.errors(include_url=False) if e["type"] != "missing"]
            rest = without_fields(doc, said)
            if rest == doc:
                return None
            doc = rest


def _pair(err: dict) -> tuple[str, str]:
    """(object path, field) of a pydantic error's field, as rule failures name them."""
    loc = _wire_loc(err["loc"])
    return _path(loc[:-1]), str(loc[-1]) if loc else ""


def knock_on(failure, failed: set[tuple[str, str]]) -> bool:
    """Whether `failure`'s rule reads a field a failure already said sits on (pure):
    `groupSize: 1` breaks grpo's rule and then the micro-batch rule that divides by
    it; fixing the first mends the second, so only the first is said."""
    return any(path == failure.path and re.search(rf"\bself\.{re.escape(name)}\b",
                                                  failure.rule.cel)
               for path, name in failed)


def without_fields(doc: dict, errors: list[dict]) -> dict:
    """A copy of `doc` without the fields pydantic's `errors` name (pure): the unknown
    ones, or any that broke the schema (their defaults then apply)."""
    out = copy.deepcopy(doc)
    for err in errors:
        loc = _wire_loc(err["loc"])
        if not loc:
            continue
        *parents, key = loc
        node: Any = out
        for part in parents:
            if isinstance(node, dict):
                node = node.get(part)
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                node = None
        if isinstance(node, dict):
            node.pop(key, None)
    return out


def parse_documents(text: str, source: str) -> list[Any]:
    """YAML documents of a file; raises RLJobError on malformed YAML."""
    try:
        return [d for d in yaml.load_all(text, Loader=YamlLoader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise RLJobError(source, [Problem(0, f"malformed YAML: {where}{problem}")]) from None


def check_text(text: str, source: str) -> list[Problem]:
    try:
        docs = parse_documents(text, source)
    except RLJobError as exc:
        return exc.problems
    if not docs:
        return [Problem(0, "no YAML documents found")]
    return [p for i, d in enumerate(docs, 1) for p in check_document(d, i)]


def load_rljob(path: str) -> RLJob:
    """The single RLJob in a YAML file, with defaults applied; RLJobError if invalid."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise RLJobError(path, [Problem(0, f"cannot read: {exc.strerror}")]) from None
    docs = parse_documents(text, path)
    if len(docs) != 1:
        raise RLJobError(path, [Problem(0, f"expected one RLJob document, found {len(docs)}")])
    problems = check_document(docs[0])
    if problems:
        raise RLJobError(path, problems)
    return RLJob.model_validate_json(json.dumps(docs[0], default=str), strict=True)
