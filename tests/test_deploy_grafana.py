"""The Grafana dashboard: valid for import, and every query uses series the agent exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from promql_names import metric_names, queryable_names

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "gpuagent.json"


def _load() -> dict:
    data: dict = json.loads(DASHBOARD.read_text())
    return data


def _panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _exprs() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in _panels(_load()["panels"])
        for target in panel.get("targets", [])
    ]


EXPRS = _exprs()


def test_dashboard_has_queries():
    assert len(EXPRS) >= 30


@pytest.mark.parametrize(("title", "expr"), EXPRS, ids=[f"{t}: {e}" for t, e in EXPRS])
def test_panel_queries_only_exported_metrics(title, expr):
    used = metric_names(expr)
    assert used, f"{title}: no metric name in {expr!r}"
    assert used <= queryable_names(), f"{title}: {sorted(used - queryable_names())}"


def test_variable_queries_use_exported_metrics():
    variables = {v["name"]: v for v in _load()["templating"]["list"]}
    assert {"cluster", "node", "instance", "gpu"} <= set(variables)
    for variable in variables.values():
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["query"]["query"])
        assert match, variable["query"]
        assert metric_names(match.group(1)) <= queryable_names()


def test_dashboard_is_importable():
    dash = _load()
    assert dash["schemaVersion"] >= 36  # Grafana 10 and later
    (source,) = dash["__inputs"]
    assert source["name"] == "DS_PROMETHEUS"
    assert source["pluginId"] == "prometheus"
    panels = list(_panels(dash["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


def test_panels_do_not_overlap():
    cells: set[tuple[int, int]] = set()
    for panel in _panels(_load()["panels"]):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & area, panel["title"]
        cells |= area


@pytest.mark.parametrize(
    "section", ["health", "XID", "ECC", "Thermal", "Power", "PCIe", "Remediation", "Inventory"]
)
def test_dashboard_has_row(section):
    rows = [p["title"] for p in _load()["panels"] if p["type"] == "row"]
    assert any(section.lower() in r.lower() for r in rows), rows
