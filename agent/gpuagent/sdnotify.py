"""systemd readiness and watchdog notifications.

Uses systemd-python where it is installed; otherwise a datagram to $NOTIFY_SOCKET, which
is all the protocol is, so a plain install works too. Outside systemd every call is a
no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable


def _pure_notify(state: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    # Out of descriptors (EMFILE) the socket cannot even be made: a notification missed,
    # never an exception that would end the watchdog loop, and with it the daemon.
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            # Never block the event loop on a receiver that is not reading: drop instead.
            sock.setblocking(False)  # noqa: FBT003 - the socket API takes a plain bool
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def _load_notify() -> Callable[[str], bool]:
    try:
        from systemd import daemon  # type: ignore[attr-defined,import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError:
        return _pure_notify

    def notify(state: str) -> bool:
        try:
            return bool(daemon.notify(state))
        except OSError:  # as above: out of descriptors, a missed notification
            return False

    return notify


class Notifier:
    def __init__(self, send: Callable[[str], bool] | None = None) -> None:
        self._send = send or _load_notify()
        self._last_status: str | None = None

    @property
    def watchdog_interval(self) -> float | None:
        """Half of WatchdogSec, as sd_watchdog_enabled(3) advises; None when disabled."""
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not usec or (pid and pid != str(os.getpid())):
            return None
        try:
            return int(usec) / 2_000_000
        except ValueError:
            return None

    def ready(self, status: str) -> None:
        self._last_status = status
        self._send(f"READY=1\nSTATUS={status}")

    def status(self, status: str) -> None:
        if status != self._last_status:
            self._last_status = status
            self._send(f"STATUS={status}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def stopping(self) -> None:
        self._send("STOPPING=1")
