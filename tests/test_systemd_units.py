"""The shipped systemd units: valid for systemd, hardened, and still what the daemon needs."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import DaemonProcess, deadline_in, require, require_that, stop_process
from gpuagent.config import parse_config
from mqtt_broker import Broker

REPO = Path(__file__).resolve().parent.parent
AGENT_UNIT = REPO / "systemd" / "gpuagent.service"
AGGREGATOR_UNIT = REPO / "systemd" / "gpuagent-aggregator.service"
HOST_UNITS = Path("/usr/lib/systemd/system")
FLEET_DOC = REPO / "docs" / "fleet.md"
CREDENTIALS_DIR = "/run/credentials/gpuagent-aggregator.service/"


def _systemd_analyze() -> str:
    return require("systemd-analyze", "verifying the units (Debian package systemd)")


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
        require_that(HOST_UNITS.is_dir(), f"the host's systemd units in {HOST_UNITS}")
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
    assert loaded == {"mqtt-key", "mqtt-password", "db-password", "command-token"}
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
        aggregator["postgres"]["password_file"],
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


@pytest.mark.parametrize("unit", [AGENT_UNIT, AGGREGATOR_UNIT], ids=lambda p: p.name)
def test_units_do_not_retry_a_configuration_error(unit: Path) -> None:
    """Exit code 2 (an invalid configuration, for `gpuagent run` and the aggregator alike)
    is not retried: restarting cannot fix a typo."""
    settings = _settings(unit)
    assert settings["Restart"] == ["on-failure"]
    assert settings["RestartPreventExitStatus"] == ["2"]


# --- restarting, under a real systemd -------------------------------------------------------

# What decides whether systemd restarts the daemon, copied from the shipped unit.
RESTART_KEYS = ("Type", "NotifyAccess", "Restart", "RestartSec", "RestartPreventExitStatus")
# A configuration with a typo, and the daemon that reads it.
TYPO = {
    AGENT_UNIT: ('[agent]\nstat_dir = "/var/lib/x"\n', "gpuagent"),
    AGGREGATOR_UNIT: ('[aggregator]\ndatabse = "/var/lib/x.sqlite"\n', "gpuagent.aggregator"),
}


class UserManager:
    """A systemd manager of its own (`systemd --user`) running test units: the host's
    systemd, if any, is not touched. systemd starts a user manager only on a machine it
    booted, so it runs in a private mount namespace with an empty /run that says so."""

    def __init__(self, root: Path) -> None:
        self.units = root / "config" / "systemd" / "user"
        self.units.mkdir(parents=True)
        runtime = root / "run"
        runtime.mkdir(mode=0o700)
        self.env = {
            **os.environ,
            "XDG_RUNTIME_DIR": str(runtime),
            "XDG_CONFIG_HOME": str(root / "config"),
        }
        systemd = Path("/lib/systemd/systemd")
        require_that(systemd.is_file(), f"{systemd} runs the units (Debian package systemd)")
        require_that(os.geteuid() == 0, "a private mount namespace for systemd --user needs root")
        unshare = require("unshare", "a private mount namespace (Debian package util-linux)")
        self.log = root / "manager.log"
        script = (
            f"mount -t tmpfs none /run && mkdir -p /run/systemd/system && exec {systemd} --user"
        )
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [unshare, "--mount", "--propagation", "private", "sh", "-c", script],
                env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = deadline_in(10)
        while not (runtime / "systemd" / "private").exists():
            assert self.process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def systemctl(self, *args: str) -> str:
        proc = subprocess.run(
            ["systemctl", "--user", *args],
            env=self.env, capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def show(self, name: str) -> dict[str, str]:
        out = self.systemctl(
            "show", name, "-p", "ActiveState,SubState,Result,NRestarts,ExecMainStatus"
        )
        return dict(line.split("=", 1) for line in out.splitlines())

    def close(self) -> None:
        stop_process(self.process)


@pytest.fixture
def user_manager(tmp_path: Path) -> Iterator[UserManager]:
    require("systemctl", "starting units (Debian package systemd)")
    manager = UserManager(tmp_path / "manager")
    try:
        yield manager
    finally:
        manager.close()


def _start_with_a_typo(manager: UserManager, tmp_path: Path, unit: Path, extra: str) -> str:
    """``unit``'s restart settings (and ``extra``) running its daemon from this checkout
    on a configuration with a typo; the test unit's name."""
    text, module = TYPO[unit]
    config = tmp_path / "typo.toml"
    config.write_text(text)
    settings = _settings(unit)
    lines = [f"{key}={value}" for key in RESTART_KEYS for value in settings.get(key, [])]
    name = f"typo-{unit.name}"
    (manager.units / name).write_text(
        "[Service]\n"
        f"ExecStart={sys.executable} -m {module} run --config {config}\n"
        + "\n".join(lines)
        + "\n"
        + extra
    )
    manager.systemctl("daemon-reload")
    manager.systemctl("start", "--no-block", name)
    return name


@pytest.mark.parametrize("unit", [AGENT_UNIT, AGGREGATOR_UNIT], ids=lambda p: p.name)
def test_a_unit_whose_configuration_has_a_typo_stops(
    user_manager: UserManager, tmp_path: Path, unit: Path
) -> None:
    """The daemon exits 2; systemd marks the unit failed and schedules no restart (it
    would be `auto-restart`, again every RestartSec, otherwise)."""
    name = _start_with_a_typo(user_manager, tmp_path, unit, "")
    deadline = deadline_in(30)
    while (state := user_manager.show(name))["ActiveState"] != "failed":
        assert state["SubState"] != "auto-restart", state
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    assert state["Result"] == "exit-code", state
    assert state["ExecMainStatus"] == "2", state
    assert state["NRestarts"] == "0", state


def test_without_restart_prevent_exit_status_the_typo_restarts_forever(
    user_manager: UserManager, tmp_path: Path
) -> None:
    """The check above can fail: the same unit with the exit status reset restarts."""
    name = _start_with_a_typo(
        user_manager, tmp_path, AGENT_UNIT, "RestartPreventExitStatus=\nRestartSec=100ms\n"
    )
    deadline = deadline_in(30)
    while int((state := user_manager.show(name))["NRestarts"]) < 2:
        assert state["ActiveState"] != "failed", state
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    user_manager.systemctl("stop", name)


def test_aggregator_unit_loads_the_command_token_the_package_generates() -> None:
    """deb/gpuagent-aggregator.postinst writes the token; the unit hands it to the dynamic
    user where the default aggregator.command_token_file reads it."""
    from gpuagent.config import AggregatorSection  # noqa: PLC0415

    source = "/etc/gpuagent/aggregator/command-token"
    assert _settings(AGGREGATOR_UNIT)["LoadCredential"] == [f"command-token:{source}"]
    assert AggregatorSection().command_token_file == CREDENTIALS_DIR + "command-token"
    postinst = (REPO / "deb" / "gpuagent-aggregator.postinst").read_text()
    token_dir, _, name = source.rpartition("/")
    assert f"TOKEN_DIR={token_dir}\n" in postinst
    assert f'"$TOKEN_DIR/{name}"' in postinst


# --- stopping within TimeoutStopSec ---------------------------------------------------------


def _seconds(value: str) -> float:
    """A systemd time span ("10s", "1min 30s", "90", "500ms") in seconds."""
    units = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "": 1.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts, value
    assert "".join(n + u for n, u in parts) == value.replace(" ", ""), value
    return sum(float(number) * units[unit] for number, unit in parts)


def test_stop_budget_is_below_the_units_timeout_stop_sec() -> None:
    """systemd SIGKILLs a daemon still stopping at TimeoutStopSec; the daemon's stop
    sequence must be over before, with a margin."""
    from gpuagent import daemon  # noqa: PLC0415

    (timeout_stop,) = _settings(AGENT_UNIT)["TimeoutStopSec"]
    assert _seconds("1min 30s") == 90.0  # the parser reads what systemd writes
    assert _seconds(timeout_stop) - 1.0 >= daemon.STOP_BUDGET_SECONDS


def test_unit_leaves_room_for_file_descriptors() -> None:
    """The local API caps its connections far below LimitNOFILE; the default soft limit
    (1024) left too little room in a drill."""
    from gpuagent import api  # noqa: PLC0415

    (limit,) = _settings(AGENT_UNIT)["LimitNOFILE"]
    assert int(limit) >= 4096
    assert int(limit) >= api.MAX_CONNECTIONS * 8


class _SlowStep:
    """Stand-ins for the daemon's parts whose stop takes the longest it may, or forever."""

    def __init__(self) -> None:
        self.goodbye_started = asyncio.Event()

    # the MQTT reporter: the goodbye to a broker that does not answer waits its 2 s
    async def run(self) -> None:
        await asyncio.Event().wait()

    async def shutdown(self) -> None:
        self.goodbye_started.set()
        await asyncio.sleep(2.0)

    def close(self) -> None:
        pass

    # the local API and the NVML source (a wedged worker): never done
    async def stop(self) -> None:
        await asyncio.Event().wait()

    async def close_nvml(self) -> None:
        await asyncio.Event().wait()


class _SlowMetrics:
    def __init__(self) -> None:
        self.given: float | None = None

    def stop(self, timeout: float = 5.0) -> None:
        self.given = timeout
        time.sleep(max(min(timeout, 5.0), 0.0))  # joins its thread for as long as allowed


def _agent(tmp_path: Path) -> Any:
    from gpuagent.config import parse_config  # noqa: PLC0415
    from gpuagent.daemon import Agent  # noqa: PLC0415

    config = parse_config(
        f'[agent]\nstate_dir = "{tmp_path / "state"}"\n[api]\nsocket = "{tmp_path / "s"}"\n'
        "[sources.kmsg]\nenabled = false\n[sources.sysfs]\nenabled = false\n"
        "[sources.udev]\nenabled = false\n[inventory]\nenabled = false\n"
    )
    return Agent(config)


async def test_stop_sequence_keeps_to_one_budget_when_every_step_takes_its_longest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Goodbye 2 s + API and NVML never + /metrics 5 s: stopped within the budget, which
    every step shares (per-step timeouts used to add up past TimeoutStopSec)."""
    from gpuagent import daemon  # noqa: PLC0415

    monkeypatch.setattr(daemon, "STOP_BUDGET_SECONDS", 3.0)
    agent = _agent(tmp_path)
    slow, metrics = _SlowStep(), _SlowMetrics()
    agent.reporter = slow
    agent._api = slow
    agent._metrics = metrics
    agent._close_sources = slow.close_nvml
    main = asyncio.create_task(agent.main_loop())
    await asyncio.sleep(0)  # its tasks start
    began = time.monotonic()
    agent.stop()
    await main
    await agent.shutdown()
    took = time.monotonic() - began
    assert slow.goodbye_started.is_set()
    assert metrics.given is not None
    assert took <= 3.0
    assert took >= 3.0 - 0.5 - 0.2  # each step had what was left, up to the deadline


async def test_shutdown_awaits_the_cancelled_remediation_task(tmp_path: Path) -> None:
    """Cancelled is not finished: a remediation cycle's cleanup (its audit record) runs
    before shutdown goes on."""
    agent = _agent(tmp_path)
    finished: list[str] = []

    async def cycle() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.05)  # writing down what was cut short
            finished.append("cleaned up")

    agent.remediation.task = task = asyncio.create_task(cycle(), name="remediation")
    await asyncio.sleep(0)
    await agent.shutdown()
    assert task.cancelled()
    assert finished == ["cleaned up"]


def test_daemon_stops_within_the_budget_against_a_silent_broker_and_a_wedged_gpu(
    run_daemon: Callable[..., DaemonProcess], mqtt_broker: Broker
) -> None:
    """SIGTERM with the MQTT goodbye unanswered (the broker is frozen) and one GPU's NVML
    worker wedged: exit code 0 within the stop budget."""
    from gpuagent import daemon as daemon_module  # noqa: PLC0415

    daemon = run_daemon(
        '[node]\ngpus = 2\nmodel = "NVIDIA H100 80GB HBM3"\n',
        config_extra=mqtt_broker.agent_config(),
        call_timeout=2.0,
    )
    deadline = deadline_in(10)
    while "gpuagent_mqtt_connected 1.0" not in daemon.metrics():
        assert time.monotonic() < deadline, "the agent did not connect to the broker"
        time.sleep(0.05)
    daemon.inject("nvml_hang", 1, seconds=60)
    daemon.wait_for(lambda d: any(g["status"] == "timeout" for g in d["gpus"]), timeout=10)
    assert mqtt_broker.process is not None
    mqtt_broker.process.send_signal(signal.SIGSTOP)  # connected, but answers nothing
    try:
        began = time.monotonic()
        daemon.process.send_signal(signal.SIGTERM)
        code = daemon.process.wait(daemon_module.STOP_BUDGET_SECONDS + 2)
        took = time.monotonic() - began
    finally:
        mqtt_broker.process.send_signal(signal.SIGCONT)
    assert code == 0, (daemon.workdir / "daemon.log").read_text()[-3000:]
    assert took <= daemon_module.STOP_BUDGET_SECONDS
