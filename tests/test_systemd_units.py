"""The shipped systemd units: valid for systemd, hardened, and still what the daemon needs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
AGENT_UNIT = REPO / "systemd" / "gpuagent.service"
AGGREGATOR_UNIT = REPO / "systemd" / "gpuagent-aggregator.service"
HOST_UNITS = Path("/usr/lib/systemd/system")


def _systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze is required in CI")
        pytest.skip("systemd-analyze is not installed")
    return path


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_systemd_analyze(), *args], capture_output=True, text=True, check=False, timeout=60
    )


def _verify(root: Path, unit_text: str, name: str) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` of ``unit_text`` as /etc/systemd/system/NAME in a root that
    has the host's units (targets the unit orders against) and executables for ExecStart."""
    if not root.exists():
        if not HOST_UNITS.is_dir():
            pytest.skip(f"{HOST_UNITS} is missing")
        shutil.copytree(HOST_UNITS, root / "usr/lib/systemd/system", symlinks=True)
        (root / "usr/bin").mkdir(parents=True)
        for program in ("gpuagent", "gpuagent-aggregator"):
            exe = root / "usr/bin" / program
            exe.write_text("#!/bin/sh\nexit 0\n")
            exe.chmod(0o755)
        (root / "etc/systemd/system").mkdir(parents=True)
    unit = root / "etc/systemd/system" / name
    unit.write_text(unit_text)
    return _analyze("verify", "--man=no", f"--root={root}", str(unit))


@pytest.mark.parametrize("unit", [AGENT_UNIT, AGGREGATOR_UNIT], ids=lambda p: p.name)
def test_unit_verifies_cleanly(tmp_path: Path, unit: Path) -> None:
    result = _verify(tmp_path / "root", unit.read_text(), unit.name)
    assert result.returncode == 0, result.stderr
    # Unknown keys and unparsable values are only warnings to systemd: any output fails.
    assert result.stdout + result.stderr == ""


def test_verify_catches_a_bad_setting(tmp_path: Path) -> None:
    """The check above can fail: a typo in the agent unit is reported."""
    text = AGENT_UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystem=strickt")
    result = _verify(tmp_path / "root", text, AGENT_UNIT.name)
    assert "strickt" in result.stdout + result.stderr


def _exposure(unit: Path) -> float:
    result = _analyze("security", "--offline=true", "--no-pager", str(unit))
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout + result.stderr
    return float(match.group(1))


@pytest.mark.parametrize(
    ("unit", "limit"), [(AGENT_UNIT, 3.0), (AGGREGATOR_UNIT, 2.0)], ids=["agent", "aggregator"]
)
def test_exposure_level(unit: Path, limit: float) -> None:
    assert _exposure(unit) <= limit


def _settings(unit: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", ";", "[")):
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_agent_unit_keeps_what_the_daemon_needs() -> None:
    settings = _settings(AGENT_UNIT)
    assert settings["Type"] == ["notify"]
    assert settings["NotifyAccess"] == ["main"]  # sd_notify comes from the daemon itself
    assert settings["WatchdogSec"]  # the daemon pings at half of WATCHDOG_USEC
    assert settings["Restart"] == ["on-failure"]
    assert "/dev/kmsg rw" in settings["DeviceAllow"]  # follow the kernel log, write drills
    assert "char-nvidia-frontend rw" in settings["DeviceAllow"]
    assert "char-nvidia-uvm rw" in settings["DeviceAllow"]
    families = " ".join(settings["RestrictAddressFamilies"]).split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"} <= set(families)  # udev netlink
    assert "ProtectKernelLogs" not in settings
    assert settings["StateDirectory"] == ["gpuagent"]
    assert settings["RuntimeDirectory"] == ["gpuagent"]
    # ProtectSystem=strict: the textfile output's Debian directory must be writable.
    assert settings["ProtectSystem"] == ["strict"]
    assert settings["ReadWritePaths"] == ["-/var/lib/prometheus/node-exporter"]
    caps = set(" ".join(settings["CapabilityBoundingSet"]).split())
    # NVML writes; the reset precondition's scan of other users' /proc/PID/fd; socket group
    assert caps == {"CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_CHOWN"}
    assert settings.get("PrivateNetwork", ["no"]) == ["no"]
    assert "ProcSubset" not in settings  # NVML reads /proc/driver/nvidia


def test_aggregator_unit_is_unprivileged() -> None:
    settings = _settings(AGGREGATOR_UNIT)
    assert settings["DynamicUser"] == ["yes"]
    assert settings["CapabilityBoundingSet"] == [""]
    assert "DeviceAllow" not in settings
    assert settings["PrivateDevices"] == ["yes"]
    families = set(" ".join(settings["RestrictAddressFamilies"]).split())
    assert families == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert settings["ExecStart"] == [
        "/usr/bin/gpuagent-aggregator run --config /etc/gpuagent/aggregator.toml"
    ]
