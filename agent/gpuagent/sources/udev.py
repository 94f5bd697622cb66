"""The udev source: NVIDIA PCI functions appearing, disappearing, and (un)binding drivers.

Events come from udev's netlink monitor as they happen, so a GPU that drops off the bus
or loses its driver is known at once rather than at the next poll.

The monitor's socket is watched with ``loop.add_reader`` rather than through pyudev's
``MonitorObserver``: the socket is non-blocking, so reading an event on the loop thread
costs microseconds, and there is no extra thread to start, hand events across and join
at shutdown. Closing is then immediate and cannot hang on a thread stuck in ``poll``.
"""

from __future__ import annotations

import asyncio
import re
import typing
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from gpuagent.sources.pcie import NVIDIA_VENDOR, canonical_bus_id, role_of
from gpuagent.supervisor import SourceUnavailable

ChangeAction = Literal["add", "remove", "bind", "unbind"]
_ACTIONS: dict[str, ChangeAction] = {action: action for action in typing.get_args(ChangeAction)}
# udevd creates this socket while it runs. Without udevd, libudev opens the monitor but
# never joins the multicast group, so it would wait forever for events that never come.
UDEV_CONTROL = Path("/run/udev/control")
# Events read per wakeup: a storm (a driver load binding every function) is read in slices
# so other callbacks get a turn; the socket stays readable and the loop calls back.
_MAX_EVENTS_PER_WAKEUP = 256
_HEX = re.compile(r"[0-9A-Fa-f]{1,8}")


@dataclass(frozen=True, slots=True)
class PciChange:
    """One udev event for an NVIDIA GPU or NVSwitch."""

    action: ChangeAction
    address: str  # canonical bus id ("0000:3b:00.0")
    driver: str | None  # set on bind (and on add/remove while bound); None on unbind
    vendor: int | None
    device_class: int | None  # 24-bit PCI class (0x030200); None if the event has none


class UdevDevice(Protocol):
    """What the watcher reads from an event (a ``pyudev.Device``)."""

    @property
    def action(self) -> str | None: ...

    @property
    def properties(self) -> Mapping[str, str]: ...


class UdevMonitor(Protocol):
    """What the watcher needs of a started, filtered monitor (a ``pyudev.Monitor``)."""

    def fileno(self) -> int: ...

    def poll(self, timeout: float | None = None) -> UdevDevice | None: ...


def change_from_device(action: str, properties: Mapping[str, str]) -> PciChange | None:
    """The change a udev event describes, or None if it is not one the agent watches.

    Kept: add/remove/bind/unbind of NVIDIA functions that are GPUs or NVSwitches (or whose
    class the event does not give). Dropped: other vendors, other functions of an NVIDIA
    card (HDMI audio, USB-C), other actions, and events whose properties do not parse.
    """
    kind = _ACTIONS.get(action)
    vendor = _vendor(properties.get("PCI_ID"))
    if kind is None or vendor != NVIDIA_VENDOR:
        return None
    class_text = properties.get("PCI_CLASS")
    device_class = _hex(class_text) if class_text is not None else None
    if class_text is not None and role_of(vendor, device_class) is None:
        return None
    address = canonical_bus_id(_slot_name(properties))
    if address is None:
        return None
    driver = properties.get("DRIVER") or None
    return PciChange(kind, address, driver, vendor, device_class)


def _vendor(pci_id: str | None) -> int | None:
    """Vendor of PCI_ID ("10DE:2330"); None unless it is VENDOR:DEVICE in hex."""
    vendor, sep, device = (pci_id or "").partition(":")
    if not sep or _hex(device) is None:
        return None
    return _hex(vendor)


def _hex(text: str) -> int | None:
    return int(text, 16) if _HEX.fullmatch(text) else None


def _slot_name(properties: Mapping[str, str]) -> str:
    """PCI_SLOT_NAME, or the last part of DEVPATH (the device's sysfs name) without it."""
    slot = properties.get("PCI_SLOT_NAME")
    if slot:
        return slot
    return properties.get("DEVPATH", "").rpartition("/")[2]


def open_netlink_monitor(udev_control: Path = UDEV_CONTROL) -> UdevMonitor:
    """udev's netlink monitor for the PCI subsystem, started. SourceUnavailable where this
    host has no udev (no udevd running, no libudev: many containers and minimal hosts);
    OSError when netlink refuses."""
    if not udev_control.exists():
        raise SourceUnavailable(
            f"no udevd runs here ({udev_control} is missing), so no device events would arrive",
            udev_control.exists,
        )
    try:
        # Imported here so a node without pyudev loses only this source, not the agent.
        import pyudev  # noqa: PLC0415

        context = pyudev.Context()  # loads libudev, ImportError when it is missing
    except ImportError as exc:
        raise SourceUnavailable(f"no udev library here: {exc}") from exc
    netlink = pyudev.Monitor.from_netlink(context)  # OSError when netlink refuses
    netlink.filter_by(subsystem="pci")  # filtered in the kernel: no wakeups for others
    netlink.start()
    monitor: UdevMonitor = netlink
    return monitor


_Item = PciChange | OSError | None  # None: the watcher was closed


class UdevWatcher:
    """Yields PCI changes of NVIDIA functions as udev reports them.

    Use from the event loop's thread. ``monitor_factory`` is the seam: it returns a
    started monitor (tests pass a fake); the default opens udev's netlink monitor.
    """

    def __init__(self, *, monitor_factory: Callable[[], UdevMonitor] | None = None) -> None:
        self._factory = monitor_factory or open_netlink_monitor
        self._queue: asyncio.Queue[_Item] | None = None
        # The loop and fd being watched; the reader callback holds the only reference to the
        # monitor, so removing it lets a pyudev monitor (and its socket) be freed.
        self._reading: tuple[asyncio.AbstractEventLoop, int] | None = None
        self._closed = False

    async def changes(self, ready: Callable[[], None] | None = None) -> AsyncIterator[PciChange]:
        """Changes until `close()`; ``ready`` is called once the monitor is open. OSError
        when the monitor cannot be opened or read, SourceUnavailable without udev."""
        if self._queue is not None:
            raise RuntimeError("changes() is already being iterated")
        if self._closed:
            return
        queue = self._queue = asyncio.Queue()
        try:
            self._start(queue)
            if ready is not None:
                ready()
            while (item := await queue.get()) is not None:
                if isinstance(item, OSError):
                    raise item
                yield item
        finally:
            self._stop_reading()
            self._queue = None

    def close(self) -> None:
        """Stop watching: a running `changes()` ends, and later ones yield nothing."""
        self._closed = True
        self._stop_reading()
        if self._queue is not None:
            self._queue.put_nowait(None)

    def _start(self, queue: asyncio.Queue[_Item]) -> None:
        monitor = self._factory()
        fd = monitor.fileno()
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, self._read, monitor, queue)
        self._reading = (loop, fd)

    def _stop_reading(self) -> None:
        reading, self._reading = self._reading, None
        if reading is not None:
            loop, fd = reading
            loop.remove_reader(fd)

    def _read(self, monitor: UdevMonitor, queue: asyncio.Queue[_Item]) -> None:
        try:
            for _ in range(_MAX_EVENTS_PER_WAKEUP):
                device = monitor.poll(timeout=0)
                if device is None:
                    return
                change = change_from_device(device.action or "", device.properties)
                if change is not None:
                    queue.put_nowait(change)
        except OSError as exc:
            self._stop_reading()
            queue.put_nowait(exc)
