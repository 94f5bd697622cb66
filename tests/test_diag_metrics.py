"""gpuagent_diag_*: the latest DCGM diagnostic of each level in the exposition, promtool's
verdict on it, and docs/metrics.md listing each family."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import require
from gpuagent.metrics.diag import OUTCOME_VALUES, SPECS
from gpuagent.model import DiagResult, DiagTest
from test_metrics_support import exposition, samples, snapshot

LEVEL1 = DiagResult(
    1,
    (0, 1),
    1_700_000_000.0,
    1_700_000_042.5,
    "bindings",
    (DiagTest("software", "pass", 0), DiagTest("software", "pass", 1)),
)
LEVEL3 = DiagResult(
    3,
    (0, 1),
    1_700_001_000.0,
    1_700_002_000.0,
    "dcgmi",
    (
        DiagTest("memory", "pass", 0),
        DiagTest("memory", "fail", 1, "A memory mismatch"),
        DiagTest(
            "memory", "pass", 1
        ),  # a second verdict on the same test and GPU: the first counts
        DiagTest("pcie", "warn", 0),
        DiagTest("targeted_power", "skip", 1),
        DiagTest("memtest", "notrun", 0),
        DiagTest("system", "fail", None, "plugin crashed"),
    ),
)
BROKEN = DiagResult(2, (), 1_700_003_000.0, 1_700_003_001.0, "dcgmi", error="no JSON")


def values(name: str, snap_diag: tuple[DiagResult, ...]) -> dict[tuple[str, ...], float]:
    found = samples(snapshot(diag=snap_diag)).get(name, [])
    return {tuple(sorted(s.labels.items())): s.value for s in found}  # type: ignore[misc]


def test_results_per_level_gpu_and_test() -> None:
    got = {
        (labels["level"], labels["gpu"], labels["test"]): s.value
        for s in samples(snapshot(diag=(LEVEL1, LEVEL3)))["gpuagent_diag_result"]
        for labels in [s.labels]
    }
    assert got == {
        ("1", "0", "software"): 1.0,
        ("1", "1", "software"): 1.0,
        ("3", "0", "memory"): 1.0,
        ("3", "1", "memory"): 0.0,
        ("3", "0", "pcie"): 2.0,
        ("3", "1", "targeted_power"): 3.0,
        ("3", "0", "memtest"): 4.0,
        ("3", "", "system"): 0.0,
    }
    assert OUTCOME_VALUES["fail"] == 0.0
    assert OUTCOME_VALUES["pass"] == 1.0


def test_passed_last_run_and_duration_per_level() -> None:
    diag = (LEVEL1, LEVEL3, BROKEN)
    assert values("gpuagent_diag_passed", diag) == {
        (("level", "1"),): 1.0,
        (("level", "3"),): 0.0,
        (("level", "2"),): 0.0,  # could not run: not a pass
    }
    assert values("gpuagent_diag_last_run_timestamp_seconds", diag)[(("level", "3"),)] == (
        1_700_002_000.0
    )
    assert values("gpuagent_diag_duration_seconds", diag)[(("level", "1"),)] == 42.5


def test_no_diagnostic_no_series() -> None:
    names = {s.name for s in SPECS}
    assert names.isdisjoint(samples(snapshot()))


def test_promtool_accepts_the_diag_families() -> None:
    promtool = require("promtool", "checks the exposition (Debian package prometheus)")
    text = exposition(snapshot(diag=(LEVEL1, LEVEL3, BROKEN)))
    diag_only = "\n".join(line for line in text.splitlines() if "gpuagent_diag_" in line) + "\n"
    for body in (diag_only, text.replace("modelName=", "model_name=")):
        result = subprocess.run(
            [promtool, "check", "metrics"],
            input=body,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        problems = [
            line
            for line in (result.stdout + result.stderr).splitlines()
            if "gpuagent_diag_" in line
        ]
        assert problems == []
        assert result.returncode in (0, 3)
    # The diag families alone are clean.
    assert (
        subprocess.run(
            [promtool, "check", "metrics"],
            input=diag_only,
            text=True,
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )


def test_documented() -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    for spec in SPECS:
        assert f"| `{spec.name}` |" in docs, spec.name
        assert spec.help in docs, spec.name
