"""Who is on the other end of a loopback TCP connection: the local user owning the peer's
socket, read from /proc/net/tcp and /proc/net/tcp6.

The peer's socket is listed with the peer's address as its *local* address and ours as its
remote one; the `uid` column is the user that created it. Only meaningful for loopback
peers (a remote peer's socket is on another host). Under systemd's `PrivateUsers=yes`, a
uid outside the service's user namespace reads as the overflow uid (65534).
"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

Address = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]

PROC_NET = Path("/proc/self/net")  # /proc/net is hidden by ProcSubset=pid; self is not
UID_COLUMN = 7


def parse_address(field: str) -> Address:
    """One address column of /proc/net/tcp{,6}: "0100007F:1F90" is 127.0.0.1:8080. The
    address is printed as 32-bit words in host byte order; IPv4-mapped IPv6 addresses
    (::ffff:a.b.c.d) come back as IPv4."""
    hex_ip, _, hex_port = field.partition(":")
    if len(hex_ip) not in (8, 32) or not hex_port:
        raise ValueError(f"not an address: {field!r}")
    raw = b"".join(
        int(hex_ip[i : i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hex_ip), 8)
    )
    return _plain(ipaddress.ip_address(raw)), int(hex_port, 16)


def _plain(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def address(host: str, port: int) -> Address:
    """An address as a socket reports it ("::ffff:127.0.0.1", 5000), normalised."""
    return _plain(ipaddress.ip_address(host.split("%", 1)[0])), port


def socket_uid(table: str, local: Address, remote: Address | None = None) -> int | None:
    """The uid owning the socket whose local address is ``local`` (and whose remote one is
    ``remote``, if given) in the text of /proc/net/tcp or tcp6; None if none is."""
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) <= UID_COLUMN:
            continue
        try:
            if parse_address(fields[1]) != local:
                continue
            if remote is not None and parse_address(fields[2]) != remote:
                continue
            return int(fields[UID_COLUMN])
        except ValueError:
            continue
    return None


def peer_uid(peer: Address, server: Address | None = None, proc: Path = PROC_NET) -> int | None:
    """The local uid owning the peer's end of a connection to ``server`` (tcp, then tcp6),
    or None (not found, /proc unreadable)."""
    for name in ("tcp", "tcp6"):
        try:
            table = (proc / name).read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        uid = socket_uid(table, peer, server)
        if uid is not None:
            return uid
    return None
