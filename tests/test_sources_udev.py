"""The udev source: the event mapping, and the watcher driven through a fake monitor."""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuagent.sources.udev import (
    PciChange,
    UdevWatcher,
    change_from_device,
    open_netlink_monitor,
)
from gpuagent.supervisor import SourceUnavailable

NVIDIA = 0x10DE
GPU_DEVPATH = "/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"


def uevent(**changes: str | None) -> dict[str, str]:
    """The properties udev sends for an H100 bound to the nvidia driver, with changes
    (None removes a property)."""
    base = {
        "DEVPATH": GPU_DEVPATH,
        "SUBSYSTEM": "pci",
        "DRIVER": "nvidia",
        "PCI_CLASS": "30200",
        "PCI_ID": "10DE:2330",
        "PCI_SUBSYS_ID": "10DE:16C1",
        "PCI_SLOT_NAME": "0000:18:00.0",
        "MODALIAS": "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00",
        "SEQNUM": "4711",
    }
    merged: dict[str, str | None] = {**base, **changes}
    return {key: value for key, value in merged.items() if value is not None}


def gpu_change(action: str, driver: str | None, device_class: int | None = 0x030200) -> PciChange:
    return PciChange(action, "0000:18:00.0", driver, NVIDIA, device_class)  # type: ignore[arg-type]


NVSWITCH = {"PCI_ID": "10DE:22A3", "PCI_CLASS": "68000", "PCI_SLOT_NAME": "0000:bb:00.0"}


# --- the mapping ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "properties", "expected"),
    [
        ("add", uevent(DRIVER=None), gpu_change("add", None)),
        ("bind", uevent(), gpu_change("bind", "nvidia")),
        # The kernel sends unbind after the driver let go, so DRIVER is absent.
        ("unbind", uevent(DRIVER=None), gpu_change("unbind", None)),
        ("remove", uevent(DRIVER=None), gpu_change("remove", None)),
        ("remove", uevent(), gpu_change("remove", "nvidia")),
        ("bind", uevent(DRIVER="vfio-pci"), gpu_change("bind", "vfio-pci")),
        (
            "bind",
            uevent(**NVSWITCH),
            PciChange("bind", "0000:bb:00.0", "nvidia", NVIDIA, 0x068000),
        ),
        # A display-capable GPU (VGA class) counts too.
        ("add", uevent(PCI_CLASS="30000"), gpu_change("add", "nvidia", 0x030000)),
        # Without PCI_CLASS the event still names an NVIDIA function.
        ("remove", uevent(PCI_CLASS=None), gpu_change("remove", "nvidia", None)),
        # Without PCI_SLOT_NAME the address is the last part of DEVPATH.
        ("unbind", uevent(PCI_SLOT_NAME=None, DRIVER=None), gpu_change("unbind", None)),
        ("bind", uevent(PCI_SLOT_NAME="0000:18:00.0".upper()), gpu_change("bind", "nvidia")),
        ("bind", uevent(DRIVER=""), gpu_change("bind", None)),
    ],
    ids=[
        "add",
        "bind",
        "unbind",
        "remove",
        "remove-bound",
        "bind-vfio",
        "nvswitch",
        "vga",
        "no-class",
        "devpath",
        "upper-case",
        "empty-driver",
    ],
)
def test_watched_events(action, properties, expected):
    assert change_from_device(action, properties) == expected


@pytest.mark.parametrize(
    ("action", "properties"),
    [
        ("change", uevent()),
        ("move", uevent()),
        ("online", uevent()),
        ("", uevent()),
        # Other vendors: a ConnectX-7 and the PCIe switch above the GPU.
        ("remove", uevent(PCI_ID="15B3:1021", PCI_CLASS="20000")),
        ("unbind", uevent(PCI_ID="1000:C030", PCI_CLASS="60400")),
        # Other functions of an NVIDIA card: HDMI audio, USB-C controller.
        ("bind", uevent(PCI_ID="10DE:10F9", PCI_CLASS="40300", PCI_SLOT_NAME="0000:18:00.1")),
        ("bind", uevent(PCI_ID="10DE:1ADA", PCI_CLASS="C0330", PCI_SLOT_NAME="0000:18:00.2")),
        # Malformed properties.
        ("add", uevent(PCI_ID=None)),
        ("add", uevent(PCI_ID="10DE")),
        ("add", uevent(PCI_ID="10DE:")),
        ("add", uevent(PCI_ID="ZZZZ:2330")),
        ("add", uevent(PCI_ID="10DE:2330:1")),
        ("add", uevent(PCI_CLASS="3O200")),
        ("add", uevent(PCI_CLASS="")),
        ("add", uevent(PCI_SLOT_NAME="3b:00.0")),
        ("add", uevent(PCI_SLOT_NAME=None, DEVPATH=None)),
        ("add", uevent(PCI_SLOT_NAME=None, DEVPATH="/devices/pci0000:15")),
    ],
)
def test_ignored_events(action, properties):
    assert change_from_device(action, properties) is None


# --- the watcher, through a fake monitor ----------------------------------------------


@dataclass(frozen=True)
class FakeDevice:
    action: str | None
    properties: Mapping[str, str]


class FakeMonitor:
    """A monitor whose fd is a pipe's read end: one byte is written per event."""

    def __init__(self) -> None:
        self._reader, self._writer = os.pipe()
        os.set_blocking(self._reader, False)
        self._pending: deque[FakeDevice] = deque()
        self.failure: OSError | None = None
        self.polls = 0

    def fileno(self) -> int:
        return self._reader

    def poll(self, timeout: float | None = None) -> FakeDevice | None:
        assert timeout == 0, "the watcher must never block the loop"
        self.polls += 1
        if self.failure is not None:
            raise self.failure
        try:
            os.read(self._reader, 1)
        except BlockingIOError:
            return None
        return self._pending.popleft()

    def emit(self, action: str | None, properties: Mapping[str, str]) -> None:
        self._pending.append(FakeDevice(action, properties))
        os.write(self._writer, b"x")

    def fail(self, error: OSError) -> None:
        self.failure = error
        os.write(self._writer, b"x")

    def close(self) -> None:
        os.close(self._reader)
        os.close(self._writer)


@pytest.fixture
def monitor() -> Iterator[FakeMonitor]:
    fake = FakeMonitor()
    yield fake
    fake.close()


async def take(watcher: UdevWatcher, count: int) -> list[PciChange]:
    got: list[PciChange] = []
    changes = watcher.changes()
    async for change in changes:
        got.append(change)
        if len(got) == count:
            break
    await changes.aclose()
    return got


async def test_changes_yields_only_nvidia_functions_in_order(monitor):
    monitor.emit("bind", uevent(PCI_ID="15B3:1021", PCI_CLASS="20000"))
    monitor.emit("unbind", uevent(DRIVER=None))
    monitor.emit("change", uevent())
    monitor.emit(None, uevent())
    monitor.emit("remove", uevent(DRIVER=None))
    watcher = UdevWatcher(monitor_factory=lambda: monitor)
    got = await asyncio.wait_for(take(watcher, 2), 5)
    assert got == [gpu_change("unbind", None), gpu_change("remove", None)]


async def test_events_arriving_while_waiting_are_delivered(monitor):
    watcher = UdevWatcher(monitor_factory=lambda: monitor)
    task = asyncio.create_task(take(watcher, 2))
    await asyncio.sleep(0.01)
    assert not task.done()
    monitor.emit("remove", uevent(DRIVER=None))
    await asyncio.sleep(0.01)
    monitor.emit("add", uevent(DRIVER=None))
    got = await asyncio.wait_for(task, 5)
    assert [c.action for c in got] == ["remove", "add"]


async def test_a_burst_is_read_completely(monitor):
    for index in range(600):
        monitor.emit("bind", uevent(PCI_SLOT_NAME=f"0000:{index // 8:02x}:00.{index % 8}"))
    watcher = UdevWatcher(monitor_factory=lambda: monitor)
    got = await asyncio.wait_for(take(watcher, 600), 5)
    assert len({c.address for c in got}) == 600


async def test_close_ends_a_running_iteration_and_stops_reading(monitor):
    watcher = UdevWatcher(monitor_factory=lambda: monitor)
    task = asyncio.create_task(take(watcher, 10))
    monitor.emit("unbind", uevent(DRIVER=None))
    await asyncio.sleep(0.01)
    watcher.close()
    assert await asyncio.wait_for(task, 5) == [gpu_change("unbind", None)]
    polls = monitor.polls
    monitor.emit("remove", uevent(DRIVER=None))
    await asyncio.sleep(0.01)
    assert monitor.polls == polls  # the fd is no longer watched
    assert await take(watcher, 1) == []  # and a closed watcher yields nothing


async def test_leaving_the_iteration_stops_reading(monitor):
    watcher = UdevWatcher(monitor_factory=lambda: monitor)
    monitor.emit("add", uevent(DRIVER=None))
    assert len(await take(watcher, 1)) == 1
    loop = asyncio.get_running_loop()
    assert loop.remove_reader(monitor.fileno()) is False


async def test_a_read_error_is_raised_from_the_iteration(monitor):
    watcher = UdevWatcher(monitor_factory=lambda: monitor)
    monitor.fail(OSError(105, "No buffer space available"))
    with pytest.raises(OSError, match="No buffer space"):
        await asyncio.wait_for(take(watcher, 1), 5)
    assert asyncio.get_running_loop().remove_reader(monitor.fileno()) is False


async def test_a_monitor_that_cannot_open_raises_at_once():
    def refuse() -> FakeMonitor:
        raise PermissionError(13, "Permission denied")

    watcher = UdevWatcher(monitor_factory=refuse)
    with pytest.raises(OSError, match="Permission denied"):
        await asyncio.wait_for(take(watcher, 1), 5)


async def test_one_iteration_at_a_time(monitor):
    watcher = UdevWatcher(monitor_factory=lambda: monitor)
    first = asyncio.create_task(take(watcher, 1))
    await asyncio.sleep(0.01)
    with pytest.raises(RuntimeError, match="already"):
        await take(watcher, 1)
    monitor.emit("bind", uevent())  # the first iteration was not disturbed
    assert await asyncio.wait_for(first, 5) == [gpu_change("bind", "nvidia")]


# --- the real netlink monitor ---------------------------------------------------------


def test_without_udev_running_the_source_is_unavailable_not_failing(tmp_path):
    control = tmp_path / "control"
    with pytest.raises(SourceUnavailable, match="no udevd runs here") as raised:
        open_netlink_monitor(control)
    appeared = raised.value.appeared
    assert appeared is not None
    assert not appeared()
    control.touch()  # udevd started: the supervisor tries again at once
    assert appeared()


def test_the_real_netlink_monitor_opens_or_fails_quickly(tmp_path):
    control = tmp_path / "control"
    control.touch()  # as if udevd ran, so libudev itself is what is tried
    started = time.monotonic()
    try:
        monitor = open_netlink_monitor(control)
    except (OSError, SourceUnavailable):
        pass  # no libudev, or no netlink here
    else:
        assert monitor.fileno() >= 0
        monitor.poll(timeout=0)  # started and non-blocking: returns at once
    assert time.monotonic() - started < 2


async def test_the_default_watcher_raises_or_waits_without_blocking():
    """On this machine: OSError (no udevd, no netlink) or an idle wait the loop survives."""
    watcher = UdevWatcher()
    changes = watcher.changes()
    started = time.monotonic()
    try:
        await asyncio.wait_for(anext(changes), 0.5)
    except (OSError, SourceUnavailable):
        pass
    except TimeoutError:
        assert Path("/run/udev/control").exists()  # it opened, and is waiting for events
    finally:
        watcher.close()
        await changes.aclose()
    assert time.monotonic() - started < 2
