"""Base class of every RLJob API model and the cross-field rule type.

A cross-field rule is written once, as a `Rule`: a CEL expression the
apiserver evaluates (emitted as `x-kubernetes-validations` in the CRD) and the
same predicate in Python that the models enforce. Both report the same
message, so `rljob validate` and `kubectl apply` say the same thing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

# Validation context key: when set, rules are not raised during parsing so the
# caller can collect every failing rule with `rule_failures` afterwards.
DEFER_RULES = "rljob.defer_rules"


@dataclass(frozen=True)
class Rule:
    """A cross-field invariant of one object, in CEL and in Python."""

    cel: str
    message: str
    check: Callable[[Any], bool]
    # JSONPath relative to the object the rule sits on, e.g. ".maxReplicas":
    # the apiserver reports the failure at that field.
    field_path: str | None = None
    # the numbers behind a failure, for offline messages (the apiserver's is `message`)
    detail: Callable[[Any], str] | None = None

    def hint(self, obj: Any) -> str:
        """The numbers of `obj` behind a failure, in parentheses ("" without `detail`)."""
        return f"({self.detail(obj)})" if self.detail else ""

    def text(self, obj: Any) -> str:
        """The message, with the numbers of `obj` when the rule has them."""
        return f"{self.message} {self.hint(obj)}".rstrip()

    def x_kubernetes_validation(self) -> dict[str, str]:
        out = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self, info: ValidationInfo) -> ApiModel:
        if info.context and info.context.get(DEFER_RULES):
            return self
        for rule in type(self).rules:
            if not rule.check(self):
                raise PydanticCustomError("rule", rule.text(self))
        return self

    def to_wire(self) -> dict[str, Any]:
        """The object as the apiserver stores it (camelCase, no unset optionals)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass(frozen=True)
class RuleFailure:
    path: str  # dotted wire path of the object, e.g. "spec.rollout"
    rule: Rule
    obj: Any = None  # the object that breaks it

    @property
    def field(self) -> str:
        """The path the apiserver names: the object, or the rule's fieldPath in it."""
        return self.path + (self.rule.field_path or "")


def rule_failures(model: ApiModel, path: str) -> Iterator[RuleFailure]:
    """Every failing rule in `model` and the models nested in it, depth first."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        child = f"{path}.{field.alias or name}" if path else (field.alias or name)
        if isinstance(value, ApiModel):
            yield from rule_failures(value, child)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, ApiModel):
                    yield from rule_failures(item, f"{child}[{i}]")
    for rule in type(model).rules:
        if not rule.check(model):
            yield RuleFailure(path, rule, model)
