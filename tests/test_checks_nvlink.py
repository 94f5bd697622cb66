"""nvlink: the error counters, judged by their growth while the agent watches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from conftest import DaemonProcess
from gpuagent.checks import HealthMemory
from gpuagent.config import ConfigError, NvlinkCheck, parse_config
from gpuagent.model import Severity
from test_checks_support import check_series, finding, gpu, kernel_event, run, with_checks

LINKS = (True,) * 18
# Totals a healthy node may carry since boot: judged alone they would alarm.
SINCE_BOOT = {
    "nvlink_crc_flit_errors": 100_000,
    "nvlink_crc_data_errors": 5,
    "nvlink_replay_errors": 40,
    "nvlink_recovery_errors": 3,
}
OK_REASON = "18 of 18 NVLinks up, none down"


def poll(**counters: Any) -> dict[str, Any]:
    return {"nvlink_up": LINKS, **SINCE_BOOT, **counters}


Steps = list[tuple[float, dict[str, Any]]]

CASES = [
    pytest.param(
        [(t, poll()) for t in (0.0, 10.0, 30.0, 60.0, 90.0)],
        Severity.OK,
        OK_REASON,
        id="flat-counters-since-boot",
    ),
    pytest.param(
        [(0.0, poll()), (10.0, poll()), (20.0, poll(nvlink_replay_errors=43))],
        Severity.WARN,
        "3 new NVLink replay errors in 20 s (0.05 per second)",
        id="replay-growth",
    ),
    pytest.param(
        [(0.0, poll()), (30.0, poll(nvlink_recovery_errors=4))],
        Severity.WARN,
        "1 new NVLink recovery error in 30 s (0.017 per second)",
        id="recovery-growth",
    ),
    pytest.param(
        [(0.0, poll()), (60.0, poll(nvlink_crc_flit_errors=100_000 + 6000))],
        Severity.OK,
        OK_REASON,
        id="crc-at-the-rate",
    ),
    pytest.param(
        [
            (0.0, poll()),
            (60.0, poll(nvlink_crc_flit_errors=150_000, nvlink_crc_data_errors=10_005)),
        ],
        Severity.WARN,
        "1000 NVLink CRC errors (flit+data) per second (60000 in 60 s), above 100",
        id="crc-above-the-rate",
    ),
    pytest.param(
        # A burst early on is counted against the whole window, not extrapolated.
        [(0.0, poll()), (5.0, poll(nvlink_crc_flit_errors=100_000 + 3000))],
        Severity.OK,
        OK_REASON,
        id="crc-burst-below-the-window-rate",
    ),
    pytest.param(
        [
            (0.0, poll()),
            # A driver reload zeroes every counter; the next polls measure from there.
            (10.0, poll(**dict.fromkeys(SINCE_BOOT, 0))),
            (20.0, poll(**dict.fromkeys(SINCE_BOOT, 0))),
        ],
        Severity.OK,
        OK_REASON,
        id="counter-reset-goes-down",
    ),
    pytest.param(
        [
            (0.0, poll()),
            (10.0, poll(nvlink_replay_errors=41)),
            (80.0, poll(nvlink_replay_errors=41)),
        ],
        Severity.OK,
        OK_REASON,
        id="replay-growth-out-of-the-window",
    ),
    pytest.param(
        [(t, {"nvlink_up": LINKS, **dict.fromkeys(SINCE_BOOT)}) for t in (0.0, 10.0, 20.0)],
        Severity.OK,
        OK_REASON,
        id="unsupported-counters",
    ),
    pytest.param(
        [(0.0, {**SINCE_BOOT}), (30.0, {**SINCE_BOOT, "nvlink_replay_errors": 41})],
        Severity.WARN,
        "1 new NVLink replay error in 30 s (0.017 per second)",
        id="errors-without-link-states",
    ),
]


@pytest.mark.parametrize(("steps", "severity", "reason"), CASES)
def test_nvlink_errors(steps: Steps, severity: Severity, reason: str) -> None:
    last = check_series("nvlink", steps)[-1]
    assert (last.severity, last.reason) == (severity, reason)
    if severity is Severity.WARN:
        assert (last.action, last.runbook) == ("investigate", "gpu-nvlink-errors")


def test_first_poll_never_alarms() -> None:
    # An agent (re)start sees only totals: nothing to compare them with yet.
    first = check_series("nvlink", [(0.0, poll(nvlink_crc_flit_errors=10**9))])[0]
    assert first.severity is Severity.OK


def test_down_link_outranks_errors() -> None:
    links = (True, False, *LINKS[2:])
    steps = [(0.0, poll(nvlink_up=links)), (30.0, poll(nvlink_up=links, nvlink_replay_errors=42))]
    last = check_series("nvlink", steps)[-1]
    assert last.severity is Severity.CRITICAL
    assert (
        last.reason
        == "NVLink 1 down (1 of 18); 2 new NVLink replay errors in 30 s (0.033 per second)"
    )
    assert last.runbook == "gpu-nvlink-down"


def test_configured_rate_and_window() -> None:
    config = with_checks(nvlink=NvlinkCheck(crc_rate_per_second=10.0, rate_window_seconds=30.0))
    steps = [(0.0, poll()), (30.0, poll(nvlink_crc_flit_errors=100_000 + 600))]
    last = check_series("nvlink", steps, config=config)[-1]
    assert last.reason == "20 NVLink CRC errors (flit+data) per second (600 in 30 s), above 10"


def test_crc_series_restarts_when_a_counter_appears() -> None:
    # Summing a counter that was not reported before would look like a jump in errors.
    steps = [
        (0.0, poll(nvlink_crc_data_errors=None)),
        (30.0, poll(nvlink_crc_data_errors=1_000_000)),
    ]
    assert check_series("nvlink", steps)[-1].severity is Severity.OK


def test_unread_poll_keeps_the_samples() -> None:
    # A poll where the GPU could not be read is no reset: growth across it still counts.
    memory = HealthMemory()
    _, memory = run(gpu(**poll()), memory=memory, now=0.0)
    _, memory = run(gpu("lost"), memory=memory, now=10.0)
    health, _ = run(gpu(**poll(nvlink_recovery_errors=5)), memory=memory, now=20.0)
    found = finding(health, "nvlink")
    assert found.reason == "2 new NVLink recovery errors in 20 s (0.033 per second)"


def test_evidence() -> None:
    steps = [(0.0, poll()), (60.0, poll(nvlink_crc_flit_errors=100_600, nvlink_replay_errors=46))]
    evidence = check_series("nvlink", steps)[-1].evidence_dict()
    assert evidence == {
        "links": 18,
        "links_up": 18,
        "links_down": "",
        "crc_flit_errors": 100_600,
        "crc_data_errors": 5,
        "replay_errors": 46,
        "recovery_errors": 3,
        "crc_errors_in_window": 600,
        "crc_rate_per_second": 10.0,
        "crc_rate_limit_per_second": 100.0,
        "replay_errors_in_window": 6,
        "replay_rate_per_second": 0.1,
        "recovery_errors_in_window": 0,
        "recovery_rate_per_second": 0.0,
        "rate_window_seconds": 60.0,
        "effective_ber_max": None,  # not reported by this GPU
        "symbol_ber_max": None,
        "c2c_links": 0,  # not a Grace-Blackwell GPU
        "c2c_crc_errors": None,
        "c2c_replay_errors": None,
        "c2c_replay_b2b_errors": None,
        "c2c_errors_in_window": None,
        "links_training": "",
        "seconds_since_boot": None,  # the boot time was not given
        "boot_grace_seconds": 300.0,
    }


def test_disabled_check_keeps_no_samples() -> None:
    config = with_checks(nvlink=NvlinkCheck(enabled=False))
    _, memory = run(gpu(**poll()), config=config)
    assert memory.for_gpu(gpu().identity.pci_bus_id).nvlink_replay.samples == ()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("crc_rate_per_second", -1.0, "must not be negative"),
        ("rate_window_seconds", 0.0, "must be greater than 0"),
    ],
)
def test_config_ranges(key: str, value: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(f"[checks.nvlink]\n{key} = {value}\n")


def test_config_keys_parse() -> None:
    text = "[checks.nvlink]\ncrc_rate_per_second = 0\nrate_window_seconds = 300\n"
    assert parse_config(text).checks.nvlink == NvlinkCheck(
        crc_rate_per_second=0.0, rate_window_seconds=300.0
    )


def _ber(effective: float | None, symbol: float | None = 0.0) -> dict[str, Any]:
    links = len(LINKS)
    return poll(
        nvlink_effective_ber=(0.0,) * 3 + (effective,) + (0.0,) * (links - 4),
        nvlink_symbol_ber=(0.0,) * 3 + (symbol,) + (0.0,) * (links - 4),
    )


@pytest.mark.parametrize(
    ("effective", "severity"),
    [(0.0, Severity.OK), (1e-12, Severity.OK), (2e-11, Severity.WARN), (None, Severity.OK)],
)
def test_a_links_effective_ber_above_dcgms_limit_warns(
    effective: float | None, severity: Severity
) -> None:
    (found,) = check_series("nvlink", [(0.0, _ber(effective))])
    assert found.severity is severity
    if severity is Severity.WARN:
        assert found.reason == "NVLink 3 effective bit-error rate 2e-11, above 1e-12"
        assert (found.action, found.runbook) == ("investigate", "gpu-nvlink-ber")
    assert found.evidence_dict()["effective_ber_max"] == (effective or 0.0)


def test_symbol_ber_is_judged_only_with_a_limit() -> None:
    steps = [(0.0, _ber(0.0, symbol=5e-10))]
    assert check_series("nvlink", steps)[0].severity is Severity.OK
    config = with_checks(nvlink=NvlinkCheck(symbol_ber_limit=1e-12))
    (found,) = check_series("nvlink", steps, config=config)
    assert found.reason == "NVLink 3 symbol bit-error rate 5e-10, above 1e-12"


def _c2c(crc: int, up: bool | None = True) -> dict[str, Any]:
    return poll(c2c_up=(up,), c2c_crc_errors=crc, c2c_replay_errors=0, c2c_replay_b2b_errors=0)


def test_c2c_errors_growing_warn_and_a_c2c_link_down_is_critical() -> None:
    # Old errors since boot alone say nothing; growth while watched does.
    steps = [(0.0, _c2c(7)), (30.0, _c2c(7))]
    assert check_series("nvlink", steps)[-1].severity is Severity.OK
    grown = check_series("nvlink", [*steps, (60.0, _c2c(10))])[-1]
    assert (grown.severity, grown.runbook) == (Severity.WARN, "gpu-c2c-errors")
    # Counted against the window since the first sample in it (as for NVLink replays).
    assert grown.reason == "3 new C2C link errors in 60 s (CRC, replay and back-to-back replay)"
    (down,) = check_series("nvlink", [(0.0, _c2c(7, up=False))])
    assert (down.severity, down.action) == (Severity.CRITICAL, "drain_and_reboot")
    assert down.reason == "C2C link 0 to the CPU down (1 of 1)"
    assert down.evidence_dict()["c2c_links"] == 1


# --- right after a boot: links still training -------------------------------------------------

TWO_DOWN = (False, True, True, False) + (True,) * 14


def _after_boot(seconds: float, config: Any = None, **readings: Any) -> Any:
    """The nvlink finding ``seconds`` after the node booted (at monotonic 1000)."""
    health, _ = run(
        gpu(**{**poll(nvlink_up=TWO_DOWN), **readings}),
        now=1000.0 + seconds,
        booted_at=1000.0,
        **({"config": config} if config is not None else {}),
    )
    return finding(health, "nvlink")


def test_links_down_within_the_boot_grace_are_training_not_down() -> None:
    found = _after_boot(42.0)
    assert (found.severity, found.action) == (Severity.OK, "none")
    assert found.reason == (
        "16 of 18 NVLinks up; NVLinks 0, 3 down, training after boot (42 s ago, grace 300 s)"
    )
    evidence = found.evidence_dict()
    assert (evidence["links_down"], evidence["links_training"]) == ("0,3", "0,3")
    assert (evidence["seconds_since_boot"], evidence["boot_grace_seconds"]) == (42.0, 300.0)


@pytest.mark.parametrize(
    ("seconds", "grace", "booted"),
    [
        pytest.param(300.0, 300.0, True, id="grace-over"),
        pytest.param(10.0, 0.0, True, id="grace-off"),
        pytest.param(10.0, 300.0, False, id="boot-time-unknown"),
    ],
)
def test_links_down_past_the_grace_are_down(seconds: float, grace: float, booted: bool) -> None:
    config = with_checks(nvlink=NvlinkCheck(boot_grace_seconds=grace))
    health, _ = run(
        gpu(**poll(nvlink_up=TWO_DOWN)),
        config=config,
        now=1000.0 + seconds,
        booted_at=1000.0 if booted else None,
    )
    found = finding(health, "nvlink")
    assert (found.severity, found.reason) == (Severity.CRITICAL, "NVLinks 0, 3 down (2 of 18)")
    assert found.evidence_dict()["links_training"] == ""


def test_errors_and_kernel_xids_are_judged_within_the_grace() -> None:
    memory = HealthMemory()
    for now, replays in ((1010.0, 40), (1030.0, 43)):
        health, memory = run(
            gpu(**poll(nvlink_up=TWO_DOWN, nvlink_replay_errors=replays)),
            memory=memory,
            now=now,
            booted_at=1000.0,
        )
    grown = finding(health, "nvlink")
    assert (grown.severity, grown.reason) == (
        Severity.WARN,
        "3 new NVLink replay errors in 20 s (0.05 per second)",
    )
    # A fatal NVLink XID a minute after boot is a fault, grace or not.
    fatal = kernel_event(
        "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error "
        "detected on link 0(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
        at=1050.0,
    )
    health, _ = run(gpu(**poll(nvlink_up=TWO_DOWN)), now=1060.0, events=(fatal,), booted_at=1000.0)
    assert finding(health, "xid").severity is Severity.CRITICAL
    assert finding(health, "nvlink").severity is Severity.OK


def test_config_boot_grace_parses() -> None:
    assert parse_config("[checks.nvlink]\nboot_grace_seconds = 0\n").checks.nvlink == (
        NvlinkCheck(boot_grace_seconds=0.0)
    )
    with pytest.raises(ConfigError, match="must not be negative"):
        parse_config("[checks.nvlink]\nboot_grace_seconds = -1\n")


def _samples(text: str, name: str, gpu: str) -> list[str]:
    return [
        line for line in text.splitlines() if line.startswith(name + "{") and f'gpu="{gpu}"' in line
    ]


def test_a_simulated_node_that_just_booted(run_daemon: Callable[..., DaemonProcess]) -> None:
    # uptime_seconds = 0: the node booted as the simulation started. Its NVLink 3 down and
    # its fabric registration in progress are training: shown, judged OK. An XID in the
    # kernel log is judged at once.
    daemon = run_daemon(
        '[node]\ngpus = 2\nuptime_seconds = 0\nfabric_state = "in_progress"\n'
        '[[fault]]\ngpu = 1\nkind = "nvlink_down"\nlink = 3\n'
    )
    doc = daemon.wait_for(lambda d: d["node"]["inventory"] is not None and len(d["gpus"]) == 2)
    assert doc["node"]["health"] == "OK", doc["node"]["findings"]
    assert [f["check"] for gpu in doc["gpus"] for f in gpu["findings"]] == []
    text = daemon.metrics()
    link3 = [line for line in _samples(text, "gpuagent_gpu_nvlink_up", "1") if 'link="3"' in line]
    assert [line.rsplit(" ", 1)[1] for line in link3] == ["0.0"]  # shown down
    nvlink = [
        line for line in _samples(text, "gpuagent_gpu_health", "1") if 'check="nvlink"' in line
    ]
    assert [line.rsplit(" ", 1)[1] for line in nvlink] == ["0.0"]  # judged OK
    short = doc["gpus"][1]["pci_bus_id"].rsplit(".", 1)[0]
    daemon.write_kernel_log(
        f"NVRM: Xid (PCI:{short}): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error "
        "detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"
    )
    doc = daemon.wait_for(lambda d: any(f["check"] == "xid" for f in d["gpus"][1]["findings"]))
    (xid,) = (f for f in doc["gpus"][1]["findings"] if f["check"] == "xid")
    assert (xid["severity"], xid["action"]) == ("CRITICAL", "reseat_or_replace")
    assert xid["reason"].startswith("Xid 74 (NVLINK_ERROR) on NVLink 3, hardware: ")
