"""A state directory the agent cannot write, from the start: the real daemon keeps
monitoring and serving metrics, reports to the broker from memory, says why in a
`state_dir` finding, and does no remediation it cannot audit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import start_daemon
from fleet_support import H100, xid_records
from mqtt_broker import Broker, Listener

pytestmark = pytest.mark.integration


def _state_dir_finding(status: dict[str, Any]) -> dict[str, Any] | None:
    findings = [f for f in status["node"]["findings"] if f["check"] == "state_dir"]
    return findings[0] if findings else None


def test_an_unusable_state_directory_degrades_reporting_and_remediation_only(
    tmp_path: Path, mqtt_broker: Broker
) -> None:
    workdir = tmp_path / "node"
    state = workdir / "state"
    # Neither database can be opened: each path is a directory (the same error SQLite
    # gives for a read-only or full file system, and it holds for root too).
    (state / "mqtt-spool.sqlite").mkdir(parents=True)
    (state / "remediation.sqlite").mkdir()
    listener = Listener(mqtt_broker, "gpuagent/v1/#", client_id="state-dir-listener")
    config = mqtt_broker.agent_config() + '[remediation]\nmode = "enforce"\n'
    daemon = start_daemon(workdir, H100, config, node_name="gpu-ro")
    try:
        # The remediation store and the spool open at different moments: the finding
        # names each once it has failed.
        status = daemon.wait_for(
            lambda d: (
                "fleet reports held in memory" in (_state_dir_finding(d) or {}).get("reason", "")
            ),
            timeout=10,
        )
        finding = _state_dir_finding(status)
        assert finding is not None
        assert finding["severity"] == "WARN"
        assert "fleet reports held in memory" in finding["reason"]
        assert "remediation paused" in finding["reason"]
        assert 'gpuagent_node_check_health{check="state_dir"} 1.0' in daemon.metrics()
        # Reports still go out, from memory.
        bus = status["gpus"][0]["pci_bus_id"]
        daemon.write_kernel_log(*xid_records(40, 20, bus))
        listener.wait_for(
            lambda ms: sum(m.topic.endswith("/gpu-ro/events") for m in ms) >= 20, timeout=15
        )
    finally:
        listener.close()
        assert daemon.stop() == 0
