"""docs/checks.md must cover every check, action, runbook id and threshold key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gpuagent.checks import (
    CHECK_NAMES,
    INVENTORY_CHECK_NAMES,
    INVENTORY_NODE_CHECK_NAMES,
    NODE_CHECK_NAMES,
    Action,
    Runbook,
)
from gpuagent.checks.engine import DCGM, INFINIBAND, KUBERNETES
from gpuagent.config import ChecksSection

DOC = (Path(__file__).resolve().parent.parent / "docs" / "checks.md").read_text(encoding="utf-8")
HEADINGS = set(re.findall(r"^#{2,4} (.+)$", DOC, flags=re.MULTILINE))


@pytest.mark.parametrize("name", CHECK_NAMES + NODE_CHECK_NAMES + INVENTORY_CHECK_NAMES)
def test_every_check_has_a_section(name: str) -> None:
    assert f"`{name}`" in HEADINGS or f"`{name}` (node)" in HEADINGS


@pytest.mark.parametrize("name", INVENTORY_NODE_CHECK_NAMES)
def test_every_inventory_node_check_has_a_section(name: str) -> None:
    assert f"`{name}` (node)" in HEADINGS


# The checks outside the tables: each only where its source applies.
OPTIONAL_CHECKS = (DCGM, INFINIBAND, KUBERNETES)
EVERY_CHECK = (
    CHECK_NAMES
    + NODE_CHECK_NAMES
    + INVENTORY_CHECK_NAMES
    + INVENTORY_NODE_CHECK_NAMES
    + OPTIONAL_CHECKS
)


@pytest.mark.parametrize("name", OPTIONAL_CHECKS)
def test_every_optional_check_has_a_section(name: str) -> None:
    assert f"`{name}`" in HEADINGS or f"`{name}` (node)" in HEADINGS


@pytest.mark.parametrize("name", EVERY_CHECK)
def test_every_check_has_a_row_in_the_table(name: str) -> None:
    assert re.search(rf"^\| `{name}`( \(node\))? (and `{name}` \(node\) )?\|", DOC, re.MULTILINE)


@pytest.mark.parametrize("action", [a.value for a in Action])
def test_every_action_is_explained(action: str) -> None:
    assert re.search(rf"^\| `{action}` \| \S", DOC, flags=re.MULTILINE)


@pytest.mark.parametrize("runbook", [r.value for r in Runbook if r.value])
def test_every_runbook_has_an_entry(runbook: str) -> None:
    assert runbook in HEADINGS


def _threshold_keys() -> list[str]:
    keys = []
    for section in dataclasses.fields(ChecksSection):
        default = getattr(ChecksSection(), section.name)
        keys += [f"checks.{section.name}.{f.name}" for f in dataclasses.fields(default)]
    return keys


@pytest.mark.parametrize("key", _threshold_keys())
def test_every_config_key_is_documented(key: str) -> None:
    assert f"`{key}`" in DOC


def _thresholds_with_defaults() -> list[tuple[str, object]]:
    pairs = []
    for section in dataclasses.fields(ChecksSection):
        default = getattr(ChecksSection(), section.name)
        pairs += [
            (f"checks.{section.name}.{f.name}", getattr(default, f.name))
            for f in dataclasses.fields(default)
            if f.name != "enabled"
        ]
    return pairs


@pytest.mark.parametrize(("key", "default"), _thresholds_with_defaults())
def test_documented_defaults_match_the_config(key: str, default: object) -> None:
    shown = f'"{default}"' if isinstance(default, str) else str(default)
    assert f"`{key}` (default `{shown}`" in DOC
