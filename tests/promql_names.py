"""Metric names used in PromQL expressions, and the names the agent really exports.

Shared by the deploy tests: every name an alert rule or dashboard panel queries must be one
the agent serves (or Prometheus' own ``up``), so a renamed metric cannot silently empty a
panel or mute an alert.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import time
from functools import cache
from pathlib import Path

from prometheus_client import generate_latest

import aggregator_support as msg
from gpuagent.aggregator.fleetrules import RULES, RuleFinding
from gpuagent.aggregator.metrics import FleetCollector, fleet_registry
from gpuagent.aggregator.service import Aggregator
from gpuagent.aggregator.sharedview import SharedView
from gpuagent.fleet import schema
from gpuagent.inventory.model import (
    GpuInventory,
    HostFacts,
    NodeInventory,
    PciFunction,
    Service,
)
from gpuagent.model import (
    EventCount,
    Finding,
    KmsgCounters,
    MqttStatus,
    NodeSnapshot,
    PcieLink,
    PciePath,
    RemediationStatus,
    Severity,
)
from test_metrics_support import BUS_IDS, exposition, gpm, ok_findings, snapshot

# Series Prometheus itself adds for every scrape target.
PROMETHEUS_NAMES = frozenset({"up"})

KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "inf",
        "nan",
    }
)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_VARIABLE = re.compile(r"\$\{?\w+(?::\w+)?\}?")
_LABEL_LIST = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_DURATION = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:ms|[smhdwy])+\b")
_IDENTIFIER = re.compile(r"(?<![\w.:$])([a-zA-Z_:][\w:]*)(?!\s*\()(?=\s|[{\[)=!<>+\-*/%^,]|$)")


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects.

    Strings, label matchers, ranges, dashboard variables and label lists are removed first;
    of what is left, an identifier not followed by ``(`` (a function call or an aggregation)
    and not a PromQL keyword is a metric name.
    """
    text = _STRING.sub(" ", expr)
    text = _VARIABLE.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    text = _DURATION.sub(" ", text)
    return {
        name
        for name in _IDENTIFIER.findall(text)
        if name.lower() not in KEYWORDS and not re.fullmatch(r"\d\w*", name)
    }


def _full_snapshot() -> NodeSnapshot:
    """A snapshot that makes every metric family the agent has carry at least one sample."""
    bus = BUS_IDS[0]
    link = PcieLink(
        bus,
        "gpu",
        current_speed_gts=32.0,
        max_speed_gts=32.0,
        current_width=16,
        max_width=16,
        aer_correctable=1,
        aer_nonfatal=0,
        aer_fatal=0,
    )
    bridge = PcieLink(
        "0000:17:00.0", "bridge", 32.0, 32.0, 16, 16, aer_correctable=0, aer_nonfatal=0
    )
    counts = (
        EventCount(bus, "xid", 79, None, 1, 1_700_000_000.0),
        EventCount(None, "sxid", 20034, None, 1, 1_700_000_000.0),
        EventCount(bus, "aer", None, "fatal", 1, 1_700_000_000.0),
        EventCount(bus, "fallen_off_bus", None, None, 1, 1_700_000_000.0),
        EventCount(bus, "gpu_reset", None, None, 1, 1_700_000_000.0),
    )
    findings = (
        *ok_findings(),
        Finding(check="pcie", severity=Severity.WARN, reason="degraded", gpu=bus),
        Finding(check="xid", severity=Severity.WARN, reason="DRILL: Xid 13", gpu=bus, drill=True),
        # The Kubernetes GPU stack's families come from this finding's evidence.
        Finding(
            check="kubernetes",
            severity=Severity.OK,
            reason="8 healthy GPUs, 8 nvidia.com/gpu allocatable",
            evidence=(
                ("resource", "nvidia.com/gpu"),
                ("gpus_advertised_expected", 8),
                ("gpus_allocatable", 8),
                ("gpus_capacity", 8),
                ("device_plugin_registered", True),
                ("cdi_gpus_missing", 0),
            ),
        ),
    )
    inventory = NodeInventory(
        host=HostFacts(
            pci=(
                PciFunction(bus, "gpu", 0x2330, "nvidia"),
                PciFunction("0000:05:00.0", "nvswitch"),
            ),
            modules=(("nvidia", True),),
            module_version="550.54.15",
            kernel_release="6.1.0-18-amd64",
            os_release="Debian GNU/Linux 12 (bookworm)",
            services=(Service("nvidia-fabricmanager", "active", restarts=0),),
        ),
        agent_version="0.1.0",
        nvml_ok=True,
        driver_version="550.54.15",
        gpus=(GpuInventory(index=0, pci_bus_id=bus, uuid="GPU-0", model="H100"),),
        expected_gpus=8,
    )
    full = snapshot(
        findings=findings,
        inventory=inventory,
        pcie=(PciePath(link, (bridge,)),),
        event_counts=counts,
        kmsg=KmsgCounters(records_read=10, records_lost=1, lines_unparsed=1),
        rejected_api_requests=(("malformed", 1),),
        remediation=RemediationStatus(
            mode="enforce",
            paused=False,
            cordoned_by_us=True,
            counts=(("reset_gpu", "succeeded", 1),),
            budgets=(("reset_gpu", "node", 2),),
        ),
        mqtt=MqttStatus(
            connected=True,
            connections=1,
            spool_depth=1,
            spool_bytes=100,
            spool_dropped=1,
            published=(("events", 1),),
            refused=(("state", 1),),
            commands=(("refresh", 1),),
            rejected_commands=(("malformed", 1),),
        ),
    )
    # A Grace-Blackwell GPU's NVLink bit-error rates and C2C link.
    blackwell = {
        "nvlink_effective_ber": (0.0,) * 18,
        "nvlink_symbol_ber": (0.0,) * 18,
        "c2c_up": (True,),
        "c2c_crc_errors": 0,
        "c2c_replay_errors": 0,
        "c2c_replay_b2b_errors": 0,
    }
    # And GPM's profiling values (DCGM_FI_PROF_*, DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL).
    gpus = tuple(
        dataclasses.replace(
            g,
            readings=dataclasses.replace(
                g.readings, **blackwell, profiling=(gpm(g.identity.index),)
            ),
        )
        if g.readings is not None
        else g
        for g in full.gpus
    )
    return dataclasses.replace(full, gpus=gpus)


def _fleet_exposition() -> str:
    """The aggregator's /metrics after a few messages of every kind (and a bad one)."""
    with tempfile.TemporaryDirectory() as tmp:
        agg = Aggregator(msg.config(Path(tmp)))
        messages = (
            ("state", msg.state("n1", fingerprint={"driver": "550.54.15"})),
            ("state", msg.offline("n2")),
            ("events", msg.event("n1")),
            ("actions", msg.cordon_request("n1")),
        )
        for channel, message in messages:
            agg.ingest.handle(msg.topic(message["node"], channel), schema.encode(message))
        agg.ingest.handle(msg.topic("n1", "events"), b"not json")
        # A finding of every fleet rule open: some families have samples only then.
        assert agg.rules is not None
        for rule in RULES:
            agg.rules.open[rule] = RuleFinding(rule, rule, "c1", "n1", "", 0.0, "", "", {})
        # What only an aggregator sharing a PostgreSQL database adds (its view's freshness;
        # the view reads nothing until it runs).
        view = SharedView(agg.state, agg.store, agg.budget, interval=1.0)
        view.refreshed_at = time.monotonic()
        shared = FleetCollector(agg.state, agg.budget, agg.store, stale_after=120.0, view=view)
        return (
            generate_latest(agg.api.registry).decode()
            + generate_latest(fleet_registry(shared)).decode()
        )


@cache
def exported_names() -> frozenset[str]:
    """Every sample name in the real expositions of the agent (a snapshot that uses every
    family) and of the aggregator."""
    text = exposition(_full_snapshot()) + _fleet_exposition()
    names = {
        re.split(r"[{\s]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    return frozenset(names)


def queryable_names() -> frozenset[str]:
    """What an expression may select: the agent's series and Prometheus' own."""
    return exported_names() | PROMETHEUS_NAMES
