"""`python3 -m gpuagent.alertrules`: the alert rules with absolute runbook links, accepted
by promtool, every other line unchanged."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import require
from gpuagent import alertrules
from gpuagent.aggregator.page import runbook_url

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "gpuagent-rules.yml"
BASE = "https://gpuagent.example/docs/"


def _alerts(text: str) -> list[dict]:
    return [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r]


def test_every_runbook_url_becomes_absolute_and_nothing_else_changes() -> None:
    original = RULES.read_text()
    rendered = alertrules.render(original, BASE)
    before, after = _alerts(original), _alerts(rendered)
    assert len(after) == len(before) > 0
    for old, new in zip(before, after, strict=True):
        relative = old["annotations"].pop("runbook_url")
        assert relative.startswith("docs/")
        assert new["annotations"].pop("runbook_url") == BASE + relative.removeprefix("docs/")
        assert new == old
    changed = [
        (a, b) for a, b in zip(original.splitlines(), rendered.splitlines(), strict=True) if a != b
    ]
    assert len(changed) == len(before)
    assert all("runbook_url:" in a for a, _ in changed)


def test_the_page_and_the_rules_link_a_runbook_alike() -> None:
    rendered = alertrules.render('  runbook_url: "docs/checks.md#gpu-lost"\n', BASE)
    assert rendered == f'  runbook_url: "{runbook_url(BASE, "gpu-lost")}"\n'


def test_promtool_accepts_the_rendered_rules(tmp_path: Path) -> None:
    promtool = require("promtool", "checks the rules (Debian package prometheus)")
    out = tmp_path / "gpuagent-rules.yml"
    out.write_text(alertrules.render(RULES.read_text(), BASE))
    result = subprocess.run(
        [promtool, "check", "rules", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts(RULES.read_text()))} rules found" in result.stdout


@pytest.mark.parametrize(
    "base", ["", "gpuagent.example/docs/", "javascript:alert(1)//", "https://x.example/docs"]
)
def test_a_bad_base_is_refused(base: str) -> None:
    with pytest.raises(ValueError, match="runbook"):
        alertrules.render(RULES.read_text(), base)


def test_absolute_urls_are_kept_and_others_outside_docs_refused() -> None:
    kept = '  runbook_url: "https://wiki.example/gpu"\n'
    assert alertrules.render(kept, BASE) == kept
    with pytest.raises(ValueError, match="neither absolute nor under docs/"):
        alertrules.render("  runbook_url: README.md#x\n", BASE)


def test_main_prints_the_rules_or_says_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert alertrules.main(["--runbook-base", BASE, str(RULES)]) == 0
    assert f'runbook_url: "{BASE}checks.md#' in capsys.readouterr().out
    assert alertrules.main(["--runbook-base", BASE, str(tmp_path / "missing.yml")]) == 2
    assert "error:" in capsys.readouterr().err
