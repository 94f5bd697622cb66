"""Who owns the peer's end of a loopback connection, from /proc/net/tcp and tcp6."""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from pathlib import Path

import pytest

from conftest import require_that
from gpuagent.aggregator.peers import address, parse_address, peer_uid, socket_uid

# Lines as the kernel wrote them (x86_64) for a listener on 127.0.0.1:54099 with a client
# from port 49886, and for [::1]:59519 with a client from [::1]:54092 and a v4-mapped
# client; only the uid column was changed, so that every socket has its own owner.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:D353 00000000:0000 0A 00000000:00000000 00:00000000 00000000   111        0 298102 1 00000000aaf5c0c0 100 0 0 10 0
   1: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1522 1 00000000fde4edff 100 0 0 10 0
   2: 0100007F:C2DE 0100007F:D353 01 00000000:00000000 00:00000000 00000000  1000        0 298103 2 00000000a96f139e 20 0 0 10 -1
   3: 0100007F:D353 0100007F:C2DE 01 00000000:00000000 00:00000000 00000000   111        0 298104 1 00000000588abc9b 20 0 0 10 -1
"""  # noqa: E501
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:B949 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   111        0 298110 1 000000005126d473 100 0 0 10 0
   1: 00000000000000000000000001000000:E87F 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   111        0 298107 1 00000000279b66c8 100 0 0 10 0
   2: 00000000000000000000000001000000:E87F 00000000000000000000000001000000:D34C 01 00000000:00000000 00:00000000 00000000   111        0 298109 1 00000000a675647c 20 0 0 10 -1
   3: 00000000000000000000000001000000:D34C 00000000000000000000000001000000:E87F 01 00000000:00000000 00:00000000 00000000  2001        0 298108 2 000000008a7e862e 20 0 0 10 -1
   4: 0000000000000000FFFF00000100007F:B949 0000000000000000FFFF00000100007F:C262 01 00000000:00000000 00:00000000 00000000   111        0 298112 1 00000000e643b323 20 0 0 10 -1
"""  # noqa: E501


@pytest.fixture
def little_endian() -> None:
    require_that(sys.byteorder == "little", "a little-endian host (the lines above are one's)")


@pytest.mark.usefixtures("little_endian")
@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("0100007F:D353", ("127.0.0.1", 54099)),
        ("00000000:07E8", ("0.0.0.0", 2024)),
        ("00000000000000000000000001000000:E87F", ("::1", 59519)),
        ("0000000000000000FFFF00000100007F:B949", ("127.0.0.1", 47433)),  # v4-mapped
        ("B80D0120000000000000000001000000:0050", ("2001:db8::1", 80)),
    ],
)
def test_parse_address(field: str, expected: tuple[str, int]) -> None:
    assert parse_address(field) == (ipaddress.ip_address(expected[0]), expected[1])


@pytest.mark.parametrize("field", ["", "0100007F", "0100007F:", "01007F:0050", "zz00007F:0050"])
def test_parse_address_refuses_garbage(field: str) -> None:
    with pytest.raises(ValueError, match=r".+"):
        parse_address(field)


@pytest.mark.usefixtures("little_endian")
@pytest.mark.parametrize(
    ("table", "local", "remote", "uid"),
    [
        # the client's socket: its local address is the peer address the server sees
        (TCP, ("127.0.0.1", 49886), ("127.0.0.1", 54099), 1000),
        (TCP, ("127.0.0.1", 49886), None, 1000),
        # the server's own accepted socket is not the peer's
        (TCP, ("127.0.0.1", 54099), ("127.0.0.1", 49886), 111),
        (TCP, ("127.0.0.1", 49886), ("127.0.0.1", 1), None),
        (TCP, ("127.0.0.2", 49886), None, None),
        (TCP6, ("::1", 54092), ("::1", 59519), 2001),
        (TCP6, ("::ffff:127.0.0.1", 47433), ("::ffff:127.0.0.1", 49762), 111),
        (TCP6, ("127.0.0.1", 47433), ("127.0.0.1", 49762), 111),
        ("", ("127.0.0.1", 1), None, None),
        (
            "header\n  0: junk\n  1: 0100007F:0001 0100007F:0002 01 x x x x nan\n",
            ("127.0.0.1", 1),
            None,
            None,
        ),
    ],
)
def test_socket_uid(
    table: str, local: tuple[str, int], remote: tuple[str, int] | None, uid: int | None
) -> None:
    there = address(*remote) if remote else None
    assert socket_uid(table, address(*local), there) == uid


def test_peer_uid_of_a_real_loopback_connection(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            peer = address(*client.getsockname())
            assert peer_uid(peer, address(*server.getsockname())) == os.getuid()
    assert peer_uid(peer, proc=tmp_path) is None  # no tables: unknown
