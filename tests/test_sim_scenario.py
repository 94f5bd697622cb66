"""Scenario files: parsing, validation errors that name key and line, the shipped scenarios."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pynvml
import pytest
from hypothesis import given, settings

from gpuagent.config import ConfigError
from gpuagent.sim import (
    FAULT_KINDS,
    Fault,
    NodeSpec,
    Scenario,
    SimulatedNode,
    load_scenario,
    parse_scenario,
)
from toml_mangling import mangled_toml

REPO = Path(__file__).resolve().parent.parent


def test_empty_scenario_is_a_healthy_h100_node() -> None:
    scenario = parse_scenario("")
    assert scenario == Scenario()
    assert scenario.node == NodeSpec()
    assert scenario.node.gpus == 8
    assert scenario.node.resolved_nvml_version == "12.550.54.15"


def test_every_node_key() -> None:
    scenario = parse_scenario(
        """
[node]
gpus = 4
model = "NVIDIA H100 80GB HBM3"
driver_version = "535.161.08"
cuda_driver_version = 12020
nvml_version = "12.535.161.08"
init_error = "no_permission"
seed = 3
nvlinks = 6
mig_mode = true
ecc = false
persistence = false
"""
    )
    assert scenario.node == NodeSpec(
        gpus=4,
        model="NVIDIA H100 80GB HBM3",
        driver_version="535.161.08",
        cuda_driver_version=12020,
        nvml_version="12.535.161.08",
        init_error="no_permission",
        seed=3,
        nvlinks=6,
        mig_mode=True,
        ecc=False,
        persistence=False,
    )


def test_faults_are_parsed_with_defaults_filled_in() -> None:
    scenario = parse_scenario(
        """
[[fault]]
at = 3
gpu = 2
kind = "ecc_dbe"

[[fault]]
gpu = 1
kind = "throttle"
reasons = ["hw_slowdown", "sw_thermal"]

[[fault]]
at = 1.5
gpu = 0
kind = "process"
pid = 77
name = "train.py"
used_mib = 2048
"""
    )
    assert scenario.faults == (
        Fault(kind="ecc_dbe", gpu=2, at=3.0, params=(("count", 1),)),
        Fault(kind="throttle", gpu=1, at=0.0, params=(("reasons", ("hw_slowdown", "sw_thermal")),)),
        Fault(
            kind="process",
            gpu=0,
            at=1.5,
            params=(
                ("pid", 77),
                ("name", "train.py"),
                ("used_mib", 2048.0),
                ("uid", 0),
                ("job", 0),
            ),
        ),
    )
    assert scenario.faults[1].param_dict() == {"reasons": ("hw_slowdown", "sw_thermal")}


TWO_DBE_FAULTS = '[[fault]]\nkind = "ecc_dbe"\ngpu = 0\n\n[[fault]]\nkind = "ecc_dbe"\ngpu = 0\n'
THREE_FAULTS = """[node]
gpus = 8

[[fault]]
gpu = 0
kind = "ecc_sbe"

[[fault]]
gpu = 1
kind = "ecc_dbe"

[[fault]]
gpu = 2
kind = "ecc_tbe"
"""


def test_unknown_fault_kind_names_key_and_line() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario(THREE_FAULTS)
    message = str(caught.value)
    assert message.startswith("fault[2].kind (line 14): unknown fault kind 'ecc_tbe' (known: ")
    assert "ecc_sbe" in message
    assert "clear" in message
    assert (caught.value.key, caught.value.line) == ("fault[2].kind", 14)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[nodes]\ngpus = 8\n", "nodes (line 1): unknown key (known here: fault, node)"),
        (
            "[node]\ngpu = 8\n",
            "node.gpu (line 2): unknown key (known here: chassis_serial, compute_mode, cuda",
        ),
        ('[node]\ngpus = "8"\n', "node.gpus (line 2): expected an integer, got str '8'"),
        ("[node]\ngpus = 17\n", "node.gpus (line 2): must be 1..16"),
        ("[node]\ngpus = 0\n", "node.gpus (line 2): must be 1..16"),
        ("[node]\nnvlinks = 19\n", "node.nvlinks (line 2): must be 0..18"),
        ("[node]\necc = 1\n", "node.ecc (line 2): expected true or false, got int 1"),
        (
            '[node]\ncompute_mode = "exclusive"\n',
            "node.compute_mode (line 2): expected one of 'default', 'exclusive_process'",
        ),
        ('[node]\nmodel = ""\n', "node.model (line 2): unknown GPU model '' (known: h100-sxm"),
        (
            '[node]\ndriver_version = "latest"\n',
            'node.driver_version (line 2): must look like "550',
        ),
        ("[node]\ncuda_driver_version = 12\n", "node.cuda_driver_version (line 2): must be CUDA"),
        ("[node]\nseed = -1\n", "node.seed (line 2): must not be negative"),
        ("[node]\nuptime_seconds = -1\n", "node.uptime_seconds (line 2): must not be negative"),
        (
            '[node]\ninit_error = "gone"\n',
            "node.init_error (line 2): expected one of 'driver_not_loaded', 'library_not_found'",
        ),
        (
            '[node]\nmig_profiles = ["1g.10gb", "9g.90gb"]\n',
            "node.mig_profiles (line 2): unknown profile '9g.90gb' (known: 1g.10gb",
        ),
        (
            '[node]\nmig_profiles = ["7g.80gb", "1g.10gb"]\n',
            "node.mig_profiles (line 2): 8 slices do not fit on one GPU of 7",
        ),
        ("node = 3\n", "node (line 1): expected a table"),
        ("fault = 3\n", "fault (line 1): expected [[fault]] tables"),
        ("[node\n", "line 1: invalid TOML"),
        ("[[fault]]\ngpu = 0\ncount = 1\n", "fault[0].kind (line 1): required"),
        ("[[fault]]\nkind = 5\ngpu = 0\n", "fault[0].kind (line 2): expected a string, got int 5"),
        ('[[fault]]\nkind = "ecc_dbe"\n', "fault[0].gpu (line 1): required"),
        (
            '[[fault]]\nkind = "ecc_dbe"\ngpu = 8\n',
            "fault[0].gpu (line 3): no such GPU: this node has 8 (0..7)",
        ),
        ('[[fault]]\nkind = "ecc_dbe"\ngpu = 1.0\n', "fault[0].gpu (line 3): expected an integer"),
        ('[[fault]]\nkind = "ecc_dbe"\ngpu = 0\nat = -1\n', "fault[0].at (line 4): must not be"),
        ('[[fault]]\nkind = "ecc_dbe"\ngpu = 0\nat = "soon"\n', "fault[0].at (line 4): expected a"),
        (
            TWO_DBE_FAULTS + "cnt = 1\n",
            "fault[1].cnt (line 8): unknown key for fault kind 'ecc_dbe' (known: count)",
        ),
        (
            '[[fault]]\nkind = "temperature"\ngpu = 0\ncelsius = "hot"\n',
            "fault[0].celsius (line 4): expected a number, got str 'hot'",
        ),
        (
            '[[fault]]\nkind = "temperature"\ngpu = 0\n',
            "fault[0].celsius (line 1): required by fault kind 'temperature'",
        ),
        (
            '[[fault]]\nkind = "throttle"\ngpu = 0\nreasons = ["hot"]\n',
            "fault[0].reasons (line 4): unknown 'hot' (known: gpu_idle",
        ),
        (
            '[node]\nnvlinks = 2\n[[fault]]\nkind = "nvlink_down"\ngpu = 0\nlink = 2\n',
            "fault[0].link (line 6): no such NVLink: this GPU has 2 links",
        ),
    ],
)
def test_invalid_scenarios_name_the_key_and_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario(text)
    assert str(caught.value).startswith(expected), str(caught.value)


def test_load_scenario_reports_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_scenario(binary)


def test_node_spec_built_in_code_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"node\.gpus: must be 1\.\.16"):
        SimulatedNode(Scenario(node=dataclasses.replace(NodeSpec(), gpus=20)))


# --- the shipped scenarios and documentation -----------------------------------------------


def test_healthy_scenario_has_no_faults() -> None:
    scenario = load_scenario(REPO / "scenarios" / "h100-healthy.toml")
    assert scenario.node.gpus == 8
    assert scenario.faults == ()


def test_demo_scenario_changes_health_within_the_first_minute() -> None:
    scenario = load_scenario(REPO / "scenarios" / "demo.toml")
    assert scenario.node.gpus == 8
    assert all(0 < f.at <= 60 for f in scenario.faults)
    kinds = {(f.kind, f.at) for f in scenario.faults}
    assert {("row_remap_pending", 20.0), ("temperature", 30.0), ("ecc_dbe", 45.0)} <= kinds
    assert any(f.kind == "ecc_sbe" for f in scenario.faults)


def test_demo_scenario_plays_out_on_its_timeline() -> None:
    clock = [0.0]
    with SimulatedNode(load_scenario(REPO / "scenarios" / "demo.toml"), clock=lambda: clock[0]):
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]

        def temperature(index: int) -> int:
            result: int = pynvml.nvmlDeviceGetTemperature(handles[index], 0)
            return result

        def dbe(index: int) -> int:
            (value,) = pynvml.nvmlDeviceGetFieldValues(
                handles[index], [pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL]
            )
            result: int = value.value.ullVal
            return result

        def thermal_throttle_ns(index: int) -> int:
            (value,) = pynvml.nvmlDeviceGetFieldValues(
                handles[index], [pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL]
            )
            result: int = value.value.ullVal
            return result

        assert temperature(6) < 50
        assert dbe(3) == 0
        assert pynvml.nvmlDeviceGetUtilizationRates(handles[6]).gpu == 0
        clock[0] = 26.0
        assert pynvml.nvmlDeviceGetUtilizationRates(handles[6]).gpu >= 88
        clock[0] = 30.0
        assert thermal_throttle_ns(6) == 0
        clock[0] = 35.0
        assert temperature(6) == 89
        assert thermal_throttle_ns(6) == 5_000_000_000
        assert pynvml.nvmlDeviceGetRemappedRows(handles[4])[2] == 1
        clock[0] = 46.0
        assert dbe(3) == 1
        clock[0] = 60.0
        assert temperature(6) < 50
        assert pynvml.nvmlDeviceGetUtilizationRates(handles[6]).gpu == 0
        assert thermal_throttle_ns(6) == 20_000_000_000  # from 30 s until the clear at 50 s


def test_docs_describe_every_fault_kind_and_node_key() -> None:
    text = (REPO / "docs" / "simulation.md").read_text()
    for kind in FAULT_KINDS:
        assert f"| `{kind}` |" in text, kind
    for spec_field in dataclasses.fields(NodeSpec):
        assert f"| `{spec_field.name}` |" in text, spec_field.name


@settings(max_examples=200, deadline=None)
@given(mangled_toml((REPO / "scenarios" / "demo.toml").read_text()))
def test_mangled_scenarios_give_config_errors_only(text: str) -> None:
    with contextlib.suppress(ConfigError):
        parse_scenario(text)


def test_the_node_booted_uptime_seconds_before_the_simulation_started() -> None:
    booted = SimulatedNode(parse_scenario("[node]\nuptime_seconds = 30\n"), clock=lambda: 5000.0)
    assert booted.booted_at == 4970.0
    # By default long before: past any post-boot grace the checks give NVLinks.
    assert SimulatedNode(Scenario(), clock=lambda: 5000.0).booted_at == 5000.0 - 86400.0
