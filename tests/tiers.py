"""Tiers whose prerequisites may be missing: the vLLM tier (its own environment), the
node tier (root, containerd and the rest), megatron-core and the mcp SDK. On a
developer's machine a tier without them skips; where the test command set them up it names them in
RLJOB_REQUIRE_TIERS (``.ci/test``: ``node,megatron,mcp`` for the main tiers, ``vllm`` for
the vLLM tier), and then a missing prerequisite fails the run with one line instead
of turning the tier's tests into skips."""

from __future__ import annotations

import importlib
import os

import pytest

TIERS = ("vllm", "node", "megatron", "mcp")


def required(tier: str) -> bool:
    """Whether the test command set `tier` up, so that it must run."""
    assert tier in TIERS, tier
    return tier in {t.strip() for t in os.environ.get("RLJOB_REQUIRE_TIERS", "").split(",")}


def unavailable(tier: str, why: str) -> None:
    """`tier` cannot run here: a failure where it is required, else a skip (of the
    module, where called at a module's top level)."""
    if required(tier):
        pytest.fail(f"the {tier} tier was set up by the test command but cannot run: {why}",
                    pytrace=False)
    pytest.skip(why, allow_module_level=True)


def import_or_skip(tier: str, module: str, reason: str):
    """`module`, imported; where it cannot be, `unavailable` with the import's error."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or an import that breaks on its own
        unavailable(tier, f"{reason}: import {module} failed ({type(exc).__name__}: {exc})")
