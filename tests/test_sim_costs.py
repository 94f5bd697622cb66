"""The simulator's cost model: NVML calls charged the CPU they take on a real H200."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pynvml

from conftest import MakeNode
from gpuagent.sim import costs, parse_scenario

LIVE = Path(__file__).parent / "data" / "live" / "h200-580.159.04" / "nvml-call-costs.txt"
_CPU_MEDIAN = re.compile(r"cpu med\s+([\d.]+) ms")


def _measured() -> tuple[dict[int, float], dict[str, float]]:
    """Field id → and call label → median thread CPU (ms), as timed on the real H200 (the
    first timing of each; a label is the line's first word)."""
    fields: dict[int, float] = {}
    calls: dict[str, float] = {}
    for line in LIVE.read_text().splitlines():
        found = _CPU_MEDIAN.search(line)
        if found is None:
            continue
        cpu = float(found[1])
        if (field := re.match(r"\s+field (\d+) ", line)) is not None:
            fields[int(field[1])] = cpu
        elif not line.startswith(("FieldValues", "field", "batch")):
            calls.setdefault(line.split()[0], cpu)
    return fields, calls


def _measured_batch(label: str) -> float:
    line = next(x for x in LIVE.read_text().splitlines() if x.startswith(label))
    found = _CPU_MEDIAN.search(line)
    assert found is not None
    return float(found[1])


def test_the_table_is_the_real_measurement() -> None:
    fields, calls = _measured()
    assert len(fields) == 29
    assert len(calls) >= 15
    for field_id, cpu in fields.items():
        if cpu > 0.01:
            assert costs.FIELD_MS[field_id] == cpu, field_id
        else:  # within a few µs of what every field not in the table is charged
            assert field_id not in costs.FIELD_MS, field_id
    # Every call measured above 0.01 ms is charged what it took; the cheap ones the default.
    named = {
        "PcieReplayCounter": "nvmlDeviceGetPcieReplayCounter",
        "EccMode": "nvmlDeviceGetEccMode",
        "MigMode": "nvmlDeviceGetMigMode",
        "GpmSampleGet": "nvmlGpmSampleGet",
        "TotalEnergyConsumption": "nvmlDeviceGetTotalEnergyConsumption",
    }
    for label, cpu in calls.items():
        if label in named:
            assert costs.call_ms(named[label]) == cpu, label
        elif label.startswith("ViolationStatus("):  # one figure for the six policies
            assert abs(costs.call_ms("nvmlDeviceGetViolationStatus") - cpu) < 0.1, label
        elif label.startswith("GpmMetricsGet"):  # one figure for 1 to 16 metrics
            assert abs(costs.call_ms("nvmlGpmMetricsGet") - cpu) < 0.15, label
        else:
            assert cpu <= 0.011, label  # within a few µs of DEFAULT_CALL_MS
    # The batches as measured, to within 5 %: the durations share their work.
    whole = _measured_batch("FieldValues(agent batch, 29)")
    assert abs(costs.field_values_ms(fields) - whole) < 0.05 * whole
    without_energy = _measured_batch("batch without 83")
    rest = [f for f in fields if f != pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
    assert abs(costs.field_values_ms(rest) - without_energy) < 0.05 * without_energy


def _thread_cpu_ms(call: object, *args: object) -> float:
    started = time.thread_time()
    call(*args)  # type: ignore[operator]
    return (time.thread_time() - started) * 1000


def test_a_charged_call_spends_the_cpu_a_real_one_does(make_node: MakeNode) -> None:
    node = make_node('[node]\ngpus = 1\nmodel = "h100-sxm"\nnvml_costs = true\n')
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    node.reset_call_counts()
    energy = [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
    spent = _thread_cpu_ms(pynvml.nvmlDeviceGetFieldValues, handle, energy)
    assert spent >= 3.175
    cheap = [pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, pynvml.NVML_FI_DEV_MEMORY_TEMP]
    pynvml.nvmlDeviceGetFieldValues(handle, cheap)
    assert _thread_cpu_ms(pynvml.nvmlDeviceGetMigMode, handle) >= 0.151
    # 3.175 + 2 x 0.005 + 0.151, to rounding
    assert abs(node.charged_cpu_ms() - 3.336) < 1e-6


def test_without_the_option_calls_cost_nothing_extra(make_node: MakeNode) -> None:
    node = make_node('[node]\ngpus = 1\nmodel = "h100-sxm"\n')
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
    assert node.charged_cpu_ms() == 0


def test_a_replayed_host_can_be_charged() -> None:
    capture = Path(__file__).parent / "data" / "real-hosts" / "h200-x1.580.159.04.nvidia-smi-q.txt"
    text = f'[node]\nnvidia_smi = "{capture}"\nnvml_costs = true\n'
    scenario = parse_scenario(text)
    assert scenario.node.nvml_costs
    assert scenario.capture is not None
