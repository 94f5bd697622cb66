"""The shipped systemd units: valid for systemd, hardened, and still what the daemon needs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from gpuagent.config import parse_config

REPO = Path(__file__).resolve().parent.parent
AGENT_UNIT = REPO / "systemd" / "gpuagent.service"
AGGREGATOR_UNIT = REPO / "systemd" / "gpuagent-aggregator.service"
HOST_UNITS = Path("/usr/lib/systemd/system")
FLEET_DOC = REPO / "docs" / "fleet.md"
CREDENTIALS_DIR = "/run/credentials/gpuagent-aggregator.service/"


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


def _verify(
    root: Path, unit_text: str, name: str, drop_in: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` of ``unit_text`` as /etc/systemd/system/NAME (with
    ``drop_in`` in NAME.d/) in a root that has the host's units (targets the unit orders
    against) and executables for ExecStart."""
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
    if drop_in is not None:
        (root / "etc/systemd/system" / f"{name}.d").mkdir(exist_ok=True)
        (root / "etc/systemd/system" / f"{name}.d" / "override.conf").write_text(drop_in)
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


def _fleet_doc_block(first_line: str) -> str:
    """The fenced block of docs/fleet.md whose first line is ``first_line``."""
    for block in re.findall(r"^```\w*\n(.*?)^```", FLEET_DOC.read_text(), re.MULTILINE | re.DOTALL):
        if block.startswith(first_line + "\n"):
            return str(block)
    raise AssertionError(f"docs/fleet.md has no block starting {first_line!r}")


def test_aggregator_credentials_drop_in_verifies(tmp_path: Path) -> None:
    """The drop-in docs/fleet.md gives for root-only secrets is valid for systemd, and the
    configuration beside it reads only credentials that the drop-in loads."""
    drop_in = _fleet_doc_block(
        "# /etc/systemd/system/gpuagent-aggregator.service.d/credentials.conf"
    )
    result = _verify(tmp_path / "root", AGGREGATOR_UNIT.read_text(), AGGREGATOR_UNIT.name, drop_in)
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""

    # The unit itself loads the command token; the drop-in adds the broker's secrets.
    from_unit = _settings(AGGREGATOR_UNIT).get("LoadCredential", [])
    from_drop_in = _settings_of(drop_in).get("LoadCredential", [])
    loaded = {value.partition(":")[0] for value in from_unit + from_drop_in}
    assert loaded == {"mqtt-key", "mqtt-password", "command-token"}
    assert len(loaded) == len(from_unit + from_drop_in)  # none loaded twice
    config_text = _fleet_doc_block("# /etc/gpuagent/aggregator.toml")
    parse_config(config_text)  # keys the aggregator knows, values of the right types
    # The alternative in comments ("# password_file = ...") counts too.
    uncommented = re.sub(r"^# (\w+ = )", r"\1", config_text, flags=re.MULTILINE)
    aggregator = tomllib.loads(uncommented)["aggregator"]
    paths = [
        aggregator["command_token_file"],
        aggregator["broker"]["key_file"],
        aggregator["broker"]["password_file"],
    ]
    assert all(path.startswith(CREDENTIALS_DIR) for path in paths), paths
    assert {path.removeprefix(CREDENTIALS_DIR) for path in paths} == loaded


def test_verify_reads_the_drop_in(tmp_path: Path) -> None:
    """The check above can fail: a drop-in's bad credential name is reported."""
    result = _verify(
        tmp_path / "root",
        AGGREGATOR_UNIT.read_text(),
        AGGREGATOR_UNIT.name,
        "[Service]\nLoadCredential=bad/name:/etc/gpuagent/key\n",
    )
    assert "bad/name" in result.stdout + result.stderr


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
    return _settings_of(unit.read_text())


def _settings_of(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
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


def test_aggregator_unit_loads_the_command_token_the_package_generates() -> None:
    """deb/postinst writes the token; the unit hands it to the dynamic user where the
    default aggregator.command_token_file reads it."""
    from gpuagent.config import AggregatorSection  # noqa: PLC0415

    source = "/etc/gpuagent/aggregator/command-token"
    assert _settings(AGGREGATOR_UNIT)["LoadCredential"] == [f"command-token:{source}"]
    assert AggregatorSection().command_token_file == CREDENTIALS_DIR + "command-token"
    postinst = (REPO / "deb" / "postinst").read_text()
    token_dir, _, name = source.rpartition("/")
    assert f"TOKEN_DIR={token_dir}\n" in postinst
    assert f'"$TOKEN_DIR/{name}"' in postinst
