"""The Prometheus alert rules: promtool accepts and unit-tests them, they query only series
the agent exports, and every alert has a test where it fires and one where it stays quiet."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import PATIENCE, require
from promql_names import metric_names, queryable_names

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "gpuagent-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "gpuagent-rules.test.yml"
DOCS = ROOT / "docs"


def _alerts() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


ALERTS = _alerts()
ALERT_NAMES = [rule["alert"] for rule in ALERTS]


def _promtool() -> str:
    return require("promtool", "checks and unit-tests the rules (Debian package prometheus)")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # `promtool test rules` takes 20 s of CPU on a quiet 2-core machine; beside a CPU hog
    # and three other test workers it passed 60 s. A slow machine is not a failure.
    return subprocess.run(
        [_promtool(), *args],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
        timeout=60 * PATIENCE,
        check=False,
    )


def test_promtool_check_rules():
    result = _run("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_test_rules():
    result = _run("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alert_names_are_unique():
    assert len(set(ALERT_NAMES)) == len(ALERT_NAMES)


@pytest.mark.parametrize("rule", ALERTS, ids=ALERT_NAMES)
def test_rule_queries_only_exported_metrics(rule):
    used = metric_names(rule["expr"])
    assert used, f"no metric name found in {rule['expr']!r}"
    assert used <= queryable_names(), sorted(used - queryable_names())


def _anchors(markdown: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in markdown.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors


@pytest.mark.parametrize("rule", ALERTS, ids=ALERT_NAMES)
def test_rule_has_severity_annotations_and_runbook(rule):
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
    url = rule["annotations"]["runbook_url"]
    page, _, anchor = url.partition("#")
    assert page.startswith("docs/"), url
    assert anchor in _anchors(ROOT / page), f"{url}: no such heading"


def _test_cases() -> dict[str, dict[str, int]]:
    """alertname -> {"fires": n, "quiet": n} over the promtool test file."""
    cases: dict[str, dict[str, int]] = {}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in test.get("alert_rule_test", []):
            kinds = cases.setdefault(check["alertname"], {"fires": 0, "quiet": 0})
            kinds["fires" if check.get("exp_alerts") else "quiet"] += 1
    return cases


@pytest.mark.parametrize("name", ALERT_NAMES)
def test_alert_has_a_firing_and_a_quiet_test(name):
    kinds = _test_cases().get(name, {"fires": 0, "quiet": 0})
    assert kinds["fires"] >= 1, f"{name} has no test where it fires"
    assert kinds["quiet"] >= 1, f"{name} has no test where it stays quiet"


def test_tests_name_only_existing_alerts():
    assert set(_test_cases()) <= set(ALERT_NAMES)


def test_alerts_doc_lists_every_alert():
    table = (DOCS / "alerts.md").read_text()
    missing = [name for name in ALERT_NAMES if f"| `{name}` |" not in table]
    assert not missing


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("gpuagent_gpu_up == 0", {"gpuagent_gpu_up"}),
        ('up{job="gpuagent"} == 0', {"up"}),
        (
            "time() - gpuagent_snapshot_timestamp_seconds > 60",
            {"gpuagent_snapshot_timestamp_seconds"},
        ),
        (
            'sum by (action) (increase(gpuagent_actions_total{job=~"$job"}[$__rate_interval]))',
            {"gpuagent_actions_total"},
        ),
        (
            "increase(x_total[10m]) > 0 or (x_total unless x_total offset 10m)",
            {"x_total"},
        ),
        (
            "(a < b) and ignoring(DCGM_FI_DRIVER_VERSION) c >= 1e3",
            {"a", "b", "c"},
        ),
        ('label_replace(m, "dst", "$1", "src", "(.*)")', {"m"}),
        ("max_over_time(m[1h:5m]) / count without (reason) (n)", {"m", "n"}),
        ('rate(m{reason=~"hw_thermal|sw_thermal"}[5m]) * 60', {"m"}),
    ],
)
def test_metric_names(expr, names):
    assert metric_names(expr) == names
