"""The RLJob contract: pydantic models (single source of truth), rules, CRD."""

from .base import ApiModel, Rule, RuleFailure, rule_failures
from .resource import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    RLJob,
    transition_failures,
)
from .spec import RLJobSpec
from .status import Condition, RLJobStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "ApiModel",
    "Condition",
    "RLJob",
    "RLJobSpec",
    "RLJobStatus",
    "Rule",
    "RuleFailure",
    "rule_failures",
    "transition_failures",
]
