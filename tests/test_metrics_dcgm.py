"""dcgm-exporter compatibility, and promtool's verdict on the whole exposition."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import re
import subprocess

import pytest

from conftest import REPO, TEST_DATA, parse_metrics, require
from gpuagent.api import CONNECTION_REASON_PREFIX
from gpuagent.config.loader import parse_config
from gpuagent.daemon import Agent
from gpuagent.metrics import diag, names
from gpuagent.metrics.names import DCGM_LABELS
from gpuagent.model import Finding, NodeSnapshot, Severity
from gpuagent.sim import parse_scenario
from promql_names import _full_snapshot
from test_diag_metrics import LEVEL1, LEVEL3
from test_metrics_support import (
    BUS_IDS,
    DRIVER,
    degraded_snapshot,
    exposition,
    gpm,
    profiled_snapshot,
    samples,
    snapshot,
)

# dcgm-exporter's default counters (etc/default-counters.csv, pre-4.9 names).
DEFAULT_COUNTERS = """\
name,type,help
DCGM_FI_DEV_SM_CLOCK,gauge,SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK,gauge,Memory clock frequency (in MHz).
DCGM_FI_DEV_MEMORY_TEMP,gauge,Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP,gauge,GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE,gauge,Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,counter,Total energy consumption since boot (in mJ).
DCGM_FI_DEV_PCIE_REPLAY_COUNTER,counter,Total number of PCIe retries.
DCGM_FI_DEV_GPU_UTIL,gauge,GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL,gauge,Memory utilization (in %).
DCGM_FI_DEV_ENC_UTIL,gauge,Encoder utilization (in %).
DCGM_FI_DEV_DEC_UTIL,gauge,Decoder utilization (in %).
DCGM_FI_DEV_XID_ERRORS,gauge,Value of the last XID error encountered.
DCGM_FI_DEV_FB_FREE,gauge,Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED,gauge,Framebuffer memory used (in MiB).
DCGM_FI_DEV_FB_RESERVED,gauge,Framebuffer memory reserved (in MiB).
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,counter,Total number of NVLink bandwidth counters for all lanes.
DCGM_FI_DEV_VGPU_LICENSE_STATUS,gauge,vGPU License status
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,counter,Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,counter,Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE,gauge,Whether remapping of rows has failed
DCGM_FI_DRIVER_VERSION,label,Driver Version
DCGM_FI_PROF_GR_ENGINE_ACTIVE,gauge,Ratio of time the graphics engine is active.
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,gauge,Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_DRAM_ACTIVE,gauge,Ratio of cycles the device memory interface is active sending or receiving data.
DCGM_FI_PROF_PCIE_TX_BYTES,gauge,The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
DCGM_FI_PROF_PCIE_RX_BYTES,gauge,The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
"""  # noqa: E501 - a verbatim copy

# The rows dcgm-exporter ships commented out that NVML alone can serve (the profiling rows
# from GPM on Hopper and later, or from DCGM on older GPUs).
OPTIONAL_COUNTERS = """\
name,type,help
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,counter,Total number of single-bit volatile ECC errors.
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,counter,Total number of double-bit volatile ECC errors.
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL,counter,Total number of single-bit persistent ECC errors.
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL,counter,Total number of double-bit persistent ECC errors.
DCGM_FI_DEV_RETIRED_SBE,counter,Total number of retired pages due to single-bit errors.
DCGM_FI_DEV_RETIRED_DBE,counter,Total number of retired pages due to double-bit errors.
DCGM_FI_DEV_RETIRED_PENDING,counter,Total number of pages pending retirement.
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,counter,Total number of NVLink flow-control CRC errors.
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,counter,Total number of NVLink data CRC errors.
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,counter,Total number of NVLink retries.
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,counter,Total number of NVLink recovery errors.
DCGM_FI_PROF_SM_ACTIVE,gauge,The ratio of cycles an SM has at least 1 warp assigned.
DCGM_FI_PROF_SM_OCCUPANCY,gauge,The ratio of number of warps resident on an SM.
DCGM_FI_PROF_PIPE_FP64_ACTIVE,gauge,Ratio of cycles the fp64 pipes are active.
DCGM_FI_PROF_PIPE_FP32_ACTIVE,gauge,Ratio of cycles the fp32 pipes are active.
DCGM_FI_PROF_PIPE_FP16_ACTIVE,gauge,Ratio of cycles the fp16 pipes are active.
"""  # noqa: E501 - a verbatim copy

# Default counters that only DCGM itself can produce.
NEEDS_DCGM = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",  # vGPU licensing
}
# Default counters that are labels on every DCGM series rather than series of their own.
LABELS = {"DCGM_FI_DRIVER_VERSION"}

# Every PromQL expression of NVIDIA's dcgm-exporter Grafana dashboard.
DASHBOARD_QUERIES = (
    'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})',
    'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})',
    'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
    'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}',
)

# Labels dcgm-exporter adds to one field beyond the GPU's (since 3.3.6).
EXTRA_LABELS = {"DCGM_FI_DEV_XID_ERRORS": {"err_code", "err_msg"}}

# dcgm-exporter's types as gpuagent exposes them: the same, counters under their exact names.
EXPOSED_TYPE = {"gauge": "gauge", "counter": "counter"}


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def parsed_families():
    # H100s: the profiling series come from GPM.
    text = exposition(profiled_snapshot())
    return {f.name: f for f in parse_metrics(text)}


def _expected_series() -> list[dict[str, str]]:
    exempt = NEEDS_DCGM | LABELS
    return [r for r in rows(DEFAULT_COUNTERS) + rows(OPTIONAL_COUNTERS) if r["name"] not in exempt]


@pytest.mark.parametrize("row", _expected_series(), ids=lambda r: r["name"])
def test_dcgm_counter_is_served_with_its_help_and_type(row):
    family = parsed_families()[row["name"]]
    assert family.documentation == row["help"]
    assert family.type == EXPOSED_TYPE[row["type"]]
    assert len(family.samples) == 8
    expected = {*DCGM_LABELS, *EXTRA_LABELS.get(row["name"], ())}
    assert all(set(s.labels) == expected for s in family.samples)


def test_the_exemptions_are_all_default_counters():
    names = {r["name"] for r in rows(DEFAULT_COUNTERS)}
    assert names >= NEEDS_DCGM | LABELS
    found = samples(snapshot())
    assert not NEEDS_DCGM & set(found)


def test_driver_version_is_a_label_like_dcgm_exporter():
    found = samples(snapshot())
    assert {s.labels["DCGM_FI_DRIVER_VERSION"] for s in found["DCGM_FI_DEV_GPU_TEMP"]} == {DRIVER}


def test_pcie_link_fields_use_dcgm_field_names():
    found = samples(snapshot())
    assert {s.value for s in found["DCGM_FI_DEV_PCIE_LINK_GEN"]} == {5.0}
    assert {s.value for s in found["DCGM_FI_DEV_PCIE_LINK_WIDTH"]} == {16.0}


def test_dashboard_queries_find_their_series():
    found = samples(profiled_snapshot())
    for query in DASHBOARD_QUERIES:
        for name in re.findall(r"DCGM_\w+", query):
            if name in NEEDS_DCGM:
                continue
            series = found[name]
            # The dashboard filters on `gpu`; our `instance` comes from the scrape.
            assert {s.labels["gpu"] for s in series} == {str(i) for i in range(8)}, query


def test_embedded_counters_match_the_reference_data():
    data = TEST_DATA  # copies of ../shared/data's files (tests/data/README.md)
    assert rows((data / "dcgm_default_counters.csv").read_text()) == rows(DEFAULT_COUNTERS)
    disabled = rows((data / "reference" / "dcgm_default_counters_commented_out.csv").read_text())
    by_name = {r["name"]: r for r in disabled}
    for row in rows(OPTIONAL_COUNTERS):
        assert {k: by_name[row["name"]][k] for k in ("name", "type", "help")} == row
    queries = (data / "reference" / "dcgm_dashboard_queries.txt").read_text().splitlines()
    assert tuple(q for q in queries if q.strip()) == DASHBOARD_QUERIES


def test_docs_compare_every_default_counter():
    """docs/metrics.md's differences table has a row for each default counter, and calls
    exactly the ones not served so."""
    docs = (REPO / "docs" / "metrics.md").read_text()
    section = docs.split("### Differences from dcgm-exporter's default metrics", 1)[1]
    section = section.split("\n### ", 1)[0]
    verdicts = dict(re.findall(r"^\| `(DCGM_\w+)` \| (.+) \|$", section, re.MULTILINE))
    defaults = [r["name"] for r in rows(DEFAULT_COUNTERS)]
    assert list(verdicts)[: len(defaults)] == defaults
    not_served = {name for name, text in verdicts.items() if "**not served**" in text}
    assert not_served == NEEDS_DCGM
    found = samples(profiled_snapshot())
    assert not not_served & set(found)
    assert set(defaults) - not_served - LABELS <= set(found)


# --- DCGM fields from what real GPUs report ----------------------------------------------


# Replayed captures of real GPUs (tests/data/real-hosts), GPU 0: its "Requested Power Limit"
# and the "Clocks Event Reasons" it prints active, as NVML's bits.
@pytest.mark.parametrize(
    ("capture", "limit", "mask"),
    [
        ("h200-x1.580.159.04.nvidia-smi-q.txt", 700.0, 0x1),  # idle
        ("h200-x1.580.159.04.nvidia-smi-q.xml", 700.0, 0x1),
        ("h200-x1-busy.590.48.01.nvidia-smi-q.txt", 700.0, 0x0),  # under gpu-burn
        ("h100-sxm-x8.535.161.08.nvidia-smi-q.txt", 700.0, 0x8 | 0x80),  # HW power brake
        ("gb200-x4-arm64.580.173.02.nvidia-smi-q.xml", 1200.0, 0x1),  # GPU, not module
    ],
)
def test_power_management_limit_and_clock_event_mask_from_real_captures(capture, limit, mask):
    from hardware_profiles_doc import REAL_HOSTS, collect  # noqa: PLC0415

    found = samples(collect(REAL_HOSTS / capture))

    def gpu0(name: str) -> float:
        return next(s.value for s in found[name] if s.labels["gpu"] == "0")

    assert gpu0("DCGM_FI_DEV_POWER_MGMT_LIMIT") == limit
    assert gpu0("DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == mask


@pytest.mark.parametrize("model", ["h200", "h100-sxm"])
def test_the_simulator_serves_the_dcgm_fields_as_the_real_gpus(model):
    """Idle, as the live H200 and H100 runs were: the 700 W limit asked for, GPU idle."""
    scenario = parse_scenario(f'[node]\nmodel = "{model}"\ngpus = 1\n')
    snap = asyncio.run(Agent(parse_config(""), simulate=scenario).collect_once())
    found = samples(snap)
    assert [s.value for s in found["DCGM_FI_DEV_POWER_MGMT_LIMIT"]] == [700.0]
    assert [s.value for s in found["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]] == [1.0]


# --- promtool -----------------------------------------------------------------------------

# promtool's linter objects to three things dcgm-exporter itself does, and compatibility
# means keeping them: the camelCase `modelName` label (reported for every family carrying
# it), a metric whose name ends in a type name, and counters without `_total` (its names).
# Nothing else may be reported.
_CAMEL_CASE_LABEL = "label names should be written in 'snake_case' not 'camelCase'"
_TYPE_IN_NAME = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'"
_NO_TOTAL = re.compile(r'^(\w+) counter metrics should have "_total" suffix$')
# The counters named without `_total`: dcgm-exporter's only (gpuagent's own end in it).
_BARE_COUNTERS = {
    m.name
    for m in (*names.DCGM_GPU_METRICS, *names.AGENT_GPU_METRICS, *names.DCGM_PROFILING_METRICS)
    if m.kind is names.Kind.COUNTER and not m.name.endswith("_total")
}


def _promtool() -> str:
    return require("promtool", "checks the exposition (Debian package prometheus)")


def _check_metrics(promtool: str, text: str) -> tuple[int, list[str]]:
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    return result.returncode, problems


def _rich_snapshot():
    snap = degraded_snapshot()
    findings = (
        *snap.health.findings,
        Finding(check="ecc", severity=Severity.WARN, reason="sbe", gpu=BUS_IDS[0]),
        Finding(check="xid", severity=Severity.CRITICAL, reason="XID 79", gpu="0000:e1:00.0"),
        Finding(check="fabricmanager", severity=Severity.WARN, reason="restarting"),
    )
    return snapshot(gpus=snap.gpus, findings=findings)


_SNAPSHOTS = {
    "none": None,
    "ok": snapshot(),
    "rich": _rich_snapshot(),
    "profiled": profiled_snapshot((1, "3g.40gb"), (2, "1g.10gb")),
}


@pytest.mark.parametrize("snap", _SNAPSHOTS.values(), ids=_SNAPSHOTS.keys())
def test_promtool_check_metrics(snap):
    promtool = _promtool()
    text = exposition(snap)
    code, problems = _check_metrics(promtool, text)
    assert code in (0, 3), problems  # 1 would be a parse error
    compatible = [p for p in problems if p.endswith(_CAMEL_CASE_LABEL) or p == _TYPE_IN_NAME]
    counters = [m[1] for m in map(_NO_TOTAL.match, problems) if m]
    assert len(compatible) + len(counters) == len(problems), problems
    # Exactly the counters the metric table names so, each declared a counter.
    assert set(counters) <= _BARE_COUNTERS
    assert all(f"\n# TYPE {name} counter\n" in text for name in counters)
    # With dcgm-exporter's label renamed, only the names dcgm-exporter chose are left.
    code, problems = _check_metrics(promtool, text.replace("modelName=", "model_name="))
    expected = [_TYPE_IN_NAME] if "DCGM_FI_DEV_PCIE_REPLAY_COUNTER{" in text else []
    assert [p for p in problems if not _NO_TOTAL.match(p)] == expected
    assert code == (3 if problems else 0)


def test_only_dcgm_exporters_counters_are_named_without_total():
    assert _BARE_COUNTERS
    assert all(name.startswith("DCGM_FI_") for name in _BARE_COUNTERS)


# A busy GB200 node, simulated: every GPU in use or in trouble (a job, past its slowdown
# temperature, the power brake, fabric health, a failed row remap, NVLink bit errors),
# IMEX, RDMA ports. What only a running daemon holds (events, remediation, MQTT, PCIe
# from sysfs, the Kubernetes stack, DCGM diagnostics, GPM) is added by hand.
_BUSY_NODE = """
[node]
model = "gb200"
gpus = 4
fabric_state = "completed"
imex = "active"
ib_hcas = 4

[[fault]]
gpu = 0
kind = "process"
pid = 4242
name = "python train.py"
used_mib = 40960

[[fault]]
gpu = 1
kind = "process"
pid = 4243
name = "python train.py"
used_mib = 40960

[[fault]]
gpu = 1
kind = "temperature"
celsius = 90

[[fault]]
gpu = 2
kind = "throttle"
reasons = ["power_brake"]

[[fault]]
gpu = 2
kind = "fabric_health"
bits = ["route_recovery"]

[[fault]]
gpu = 3
kind = "row_remap_failure"

[[fault]]
gpu = 3
kind = "nvlink_ber"
link = 0
effective_ber = 0.00001
"""


def _busy_snapshot() -> NodeSnapshot:
    config = parse_config("[inventory.expected]\ngpus = 4\n")
    node = asyncio.run(Agent(config, simulate=parse_scenario(_BUSY_NODE)).collect_once())
    daemon = _full_snapshot()
    gpus = tuple(
        dataclasses.replace(g, readings=dataclasses.replace(g.readings, profiling=(gpm(i),)))
        if g.readings is not None
        else g
        for i, g in enumerate(node.gpus)
    )
    # Every port counter node_exporter names, where the simulated HCA has only some.
    assert node.infiniband
    first, *others = node.infiniband
    port = dataclasses.replace(
        first.ports[0], counters=tuple((file, 1) for file, _ in names.IB_PORT_COUNTERS)
    )
    infiniband = (dataclasses.replace(first, ports=(port, *first.ports[1:])), *others)
    kubernetes = tuple(f for f in daemon.health.findings if f.check == "kubernetes")
    # A drill on the first GPU: its family too.
    bus = node.gpus[0].identity.pci_bus_id
    drill = Finding("xid", Severity.WARN, "DRILL: Xid 13", bus, drill=True, cause="13")
    assert daemon.mqtt is not None
    return dataclasses.replace(
        node,
        gpus=gpus,
        infiniband=infiniband,
        health=dataclasses.replace(
            node.health, findings=(*node.health.findings, *kubernetes, drill)
        ),
        pcie=daemon.pcie,
        event_counts=daemon.event_counts,
        kmsg=daemon.kmsg,
        remediation=daemon.remediation,
        mqtt=dataclasses.replace(daemon.mqtt, disconnects=(("Session taken over", 1),)),
        rejected_api_requests=(("malformed", 1), (f"{CONNECTION_REASON_PREFIX}limit", 1)),
        diag=(LEVEL1, LEVEL3),
    )


def test_promtool_finds_nothing_in_gpuagents_own_families_on_a_busy_node():
    promtool = _promtool()
    text = exposition(_busy_snapshot())
    declared = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    # Every family of the agent's own carries samples here.
    own = [
        *(v.name for v in vars(names).values() if isinstance(v, names.MetricSpec)),
        *(m.name for m in names.AGENT_GPU_METRICS),
        *(spec.name for _, spec in names.IB_PORT_COUNTERS),
        *(spec.name for spec in diag.SPECS),
    ]
    own = [name for name in own if not name.startswith("DCGM_FI_")]
    assert [name for name in own if name not in declared] == []
    counters = [name for name, kind in declared.items() if kind == "counter"]
    assert [n for n in counters if not n.startswith("DCGM_FI_") and not n.endswith("_total")] == []
    # `modelName` is dcgm-exporter's camelCase label, on our per-GPU families too so that
    # they join with its series: renamed here, so that promtool judges the names alone.
    code, problems = _check_metrics(promtool, text.replace("modelName=", "model_name="))
    assert code in (0, 3), problems  # 1 would be a parse error
    # dcgm-exporter's names keep its spelling (no `_total`, "COUNTER" in a name): those
    # findings are compatibility's price; nothing else may be reported.
    assert [p for p in problems if not p.startswith("DCGM_FI_")] == []
