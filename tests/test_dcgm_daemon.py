"""The real daemon on a simulated node with the DCGM stand-in (and without DCGM at all)."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess

STANDIN = Path(__file__).resolve().parent / "dcgm_standin"
H100 = '[node]\ngpus = {gpus}\nmodel = "NVIDIA H100 80GB HBM3"\n'
Run = Callable[..., DaemonProcess]


def _engine() -> Any:
    sys.path.insert(0, str(STANDIN))
    try:
        return importlib.import_module("_standin_engine")
    finally:
        sys.path.remove(str(STANDIN))


def _dcgm_config(path: Path) -> str:
    return (
        f'[sources.dcgm]\nbindings_path = "{path}"\nhealth_interval_seconds = 0.2\n'
        "reconnect_max_seconds = 0.5\n"
    )


def _dcgm_finding(doc: dict[str, Any], bus_id: str) -> dict[str, Any] | None:
    gpu = next(g for g in doc["gpus"] if g["pci_bus_id"] == bus_id)
    return next((f for f in gpu["findings"] if f["check"] == "dcgm"), None)


def test_dcgm_incident_is_a_finding_and_survives_a_restart(
    run_daemon: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine()
    control = engine.Control(tmp_path / "dcgm.json")
    monkeypatch.setenv(engine.STATE_ENV, control.path)
    # DCGM's GPUs are the simulated node's (GPU 1 of the simulator sits at 2a:00.0).
    control.set_gpus(
        [engine.default_gpu(0), {**engine.default_gpu(1), "pci_bus_id": "00000000:2A:00.0"}]
    )
    daemon = run_daemon(H100.format(gpus=2), config_extra=_dcgm_config(STANDIN))
    doc = daemon.wait_for(lambda d: (d["dcgm"] or {}).get("state") == "up")
    assert doc["dcgm"]["hostengine"] == "127.0.0.1:5555"
    assert doc["dcgm"]["version"]
    assert any(s["name"] == "dcgm" and s["up"] for s in doc["sources"])
    assert _dcgm_finding(doc, "0000:18:00.0") is None  # OK findings are not listed

    # An InfoROM failure: nothing the agent's own checks see, so a finding of its own.
    control.add_health_incident(0x40, 20, 9, "InfoROM is corrupt", 0)
    doc = daemon.wait_for(lambda d: _dcgm_finding(d, "0000:18:00.0") is not None)
    finding = _dcgm_finding(doc, "0000:18:00.0")
    assert finding is not None
    assert finding["severity"] == "CRITICAL"
    assert "InfoROM is corrupt" in finding["reason"]
    assert finding["runbook"] == "gpu-dcgm-health"
    result = daemon.cli("status", "--socket", str(daemon.socket), "--json")
    assert json.loads(result.stdout)["dcgm"]["incidents"][0]["system"] == "inforom"
    assert daemon.metric("gpuagent_source_up", source="dcgm") == 1.0

    # A policy XID pushed by DCGM is an XID event of that GPU, then a finding of the xid
    # check; the same XID in the kernel log a moment later is the same fault, not a second.
    control.fire_policy_violation(0x40, 1, errnum=79)
    doc = daemon.wait_for(
        lambda d: any(
            f["check"] == "xid"
            for g in d["gpus"]
            if g["pci_bus_id"] == "0000:2a:00.0"
            for f in g["findings"]
        )
    )
    assert daemon.metric("gpuagent_xid_errors_total", xid="79") == 1
    usec = int(time.monotonic() * 1e6)  # the kernel's timestamp: now, on the same clock
    daemon.write_kernel_log(
        f"4,1,{usec},-;NVRM: Xid (PCI:0000:2a:00): 79, pid=0, GPU has fallen off the bus."
    )
    doc = daemon.wait_for(lambda d: d["kmsg"]["records_read"] >= 1)
    assert doc["kmsg"]["lines_unparsed"] == 0
    time.sleep(0.5)
    assert daemon.metric("gpuagent_xid_errors_total", xid="79") == 1

    # The host engine restarts: down, then back with its watches (the incident returns).
    control.host_engine_down()
    daemon.wait_for(lambda d: d["dcgm"]["state"] == "down")
    assert daemon.metric("gpuagent_source_up", source="dcgm") == 0.0
    # Down is not "nothing new": the node says DCGM cannot be seen.
    node = daemon.wait_for(lambda d: _node_dcgm(d) is not None)["node"]
    finding = _node_dcgm({"node": node})
    assert finding is not None
    assert finding["severity"] == "WARN"
    assert finding["runbook"] == "node-dcgm-down"
    assert finding["reason"].startswith("DCGM host engine unreachable")
    control.host_engine_up()
    daemon.wait_for(lambda d: d["dcgm"]["state"] == "up" and d["dcgm"]["incidents"])
    daemon.wait_for(lambda d: _node_dcgm(d) is None)


def _node_dcgm(doc: dict[str, Any]) -> dict[str, Any] | None:
    return next((f for f in doc["node"]["findings"] if f["check"] == "dcgm"), None)


def test_node_without_dcgm_is_unchanged(run_daemon: Run, tmp_path: Path) -> None:
    empty = tmp_path / "no-bindings"
    empty.mkdir()
    daemon = run_daemon(H100.format(gpus=2), config_extra=_dcgm_config(empty))
    doc = daemon.status()
    assert doc["dcgm"]["state"] == "absent"
    assert "dcgm" not in {s["name"] for s in doc["sources"]}
    assert all(f["check"] != "dcgm" for g in doc["gpus"] for f in g["findings"])
    assert "dcgm" not in {f["check"] for f in doc["node"]["findings"]}
    assert 'source="dcgm"' not in daemon.metrics()
    assert doc["node"]["health"] == "OK"


def test_one_shot_check_does_not_load_dcgm(tmp_path: Path) -> None:
    from gpuagent.config import Config, DcgmSourceSection, SourcesSection  # noqa: PLC0415
    from gpuagent.daemon import Agent  # noqa: PLC0415

    scenario = tmp_path / "scenario.toml"
    scenario.write_text(H100.format(gpus=1))
    config = Config(sources=SourcesSection(dcgm=DcgmSourceSection(bindings_path=str(STANDIN))))
    snapshot = asyncio.run(Agent(config, simulate=scenario).collect_once())
    assert snapshot.dcgm is None
    assert "dcgm" not in {f.check for f in snapshot.health.findings}
