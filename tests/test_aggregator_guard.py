"""The aggregator's HTTP defences on a real port: the command token, the Host check, who
sent a command, deeply nested JSON, and the header, body and keep-alive timeouts and the
connection cap."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import aggregator_support as msg
from conftest import PATIENCE, deadline_in, free_port
from gpuagent.aggregator import cli
from gpuagent.aggregator.http import NO_TOKEN, allowed_hosts, host_allowed
from gpuagent.aggregator.ingest import Outgoing
from gpuagent.aggregator.service import Aggregator, read_command_token
from gpuagent.config import AggregatorHttpSection, AggregatorSection, parse_config
from gpuagent.fleet import schema

NESTED = b"[" * 30000 + b"]" * 30000


class Running:
    """An aggregator serving on a loopback port, its commands captured (no broker)."""

    def __init__(self, agg: Aggregator, port: int) -> None:
        self.agg = agg
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.sent: list[Outgoing] = []

    async def publish(self, out: Outgoing) -> None:
        self.sent.append(out)

    @property
    def counters(self) -> Any:
        return self.agg.state.counters


async def _start(tmp_path: Path, **overrides: Any) -> Running:
    port = free_port()
    agg = Aggregator(msg.config(tmp_path, port=port, **overrides))
    await agg.start()
    running = Running(agg, port)
    object.__setattr__(agg.api, "publish", running.publish)  # no broker: capture
    agg.ingest.handle(msg.topic("n1", "state"), schema.encode(msg.state("n1")))
    return running


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    r = await _start(tmp_path)
    try:
        yield r
    finally:
        await r.agg.close()


async def _post(
    url: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json", **(headers or {})}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers=headers) as response,
    ):
        return response.status, await response.json()


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, await response.text()


# --- 1. commands need a token ---------------------------------------------------------


def test_the_token_defaults_to_the_systemd_credential() -> None:
    assert AggregatorSection().command_token_file == (
        "/run/credentials/gpuagent-aggregator.service/command-token"
    )
    assert parse_config("[aggregator]\n").aggregator.command_token_file.endswith("command-token")


def test_config_check_passes_without_the_token_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default token path exists only under systemd: `config check` does not read it."""
    config = tmp_path / "aggregator.toml"
    config.write_text('[aggregator]\ncommand_token_file = "/nonexistent/command-token"\n')
    assert cli.main(["config", "check", str(config)]) == 0
    assert "valid" in capsys.readouterr().out


@pytest.mark.parametrize("token_file", ["missing", "empty", ""])
async def test_without_a_token_commands_are_refused_even_from_this_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, token_file: str
) -> None:
    """No readable token: the aggregator runs and serves the read-only API, and refuses
    every command, from loopback too, whatever Authorization says."""
    path = ""
    if token_file:
        path = str(tmp_path / "command-token")
        if token_file == "empty":
            Path(path).write_text("")
    with caplog.at_level(logging.INFO):
        r = await _start(tmp_path, command_token_file=path)
    try:
        assert (await _get(r.base + "/api/v1/nodes"))[0] == 200
        url = r.base + "/api/v1/nodes/n1/commands"
        for headers in ({}, {"Authorization": "Bearer "}, msg.AUTH):
            status, body = await _post(url, b'{"command": "refresh"}', headers)
            assert (status, body) == (403, {"error": NO_TOKEN})
    finally:
        await r.agg.close()
    assert r.sent == []
    assert r.counters.commands_rejected == {"no_token": 3}
    disabled = [m for m in caplog.messages if "commands are disabled" in m]
    assert len(disabled) == 1  # at start, once
    assert read_command_token(path) == ""


async def test_every_command_needs_the_bearer_token(running: Running) -> None:
    url = running.base + "/api/v1/nodes/n1/commands"
    for headers, expected in (
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": f"Bearer {msg.COMMAND_TOKEN}x"}, 401),
        ({"Authorization": msg.COMMAND_TOKEN}, 401),
        (msg.AUTH, 202),
    ):
        status, _ = await _post(url, b'{"command": "refresh"}', headers)
        assert status == expected, headers
    assert len(running.sent) == 1
    assert running.counters.commands_rejected == {"bad_token": 4}


async def test_accepted_and_refused_commands_are_logged_with_who_sent_them(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    url = running.base + "/api/v1/nodes/n1/commands"
    with caplog.at_level(logging.INFO, logger="gpuagent.aggregator.audit"):
        status, accepted = await _post(url, b'{"command": "refresh"}', msg.AUTH)
        assert status == 202
        status, _ = await _post(url, b'{"command": "refresh"}', {"Authorization": "Bearer no"})
        assert status == 401
        status, _ = await _post(url, b'{"command": "format_disk"}', msg.AUTH)
        assert status == 400
    audit = [r.getMessage() for r in caplog.records if r.name == "gpuagent.aggregator.audit"]
    assert len(audit) == 3, audit
    me = f"uid={os.getuid()}"
    assert audit[0].startswith("command accepted: node=n1 cluster=c1 command=refresh ")
    assert f"id={accepted['id']} " in audit[0]
    assert audit[1].startswith("command refused (bad_token, 401): node='n1'")
    assert audit[2].startswith("command refused (invalid, 400): node='n1' command='format_disk'")
    for line in audit:
        assert " from 127.0.0.1:" in line
        assert line.endswith(me), line


# --- 2. the Host header -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:{port}", True),
        ("localhost:{port}", True),
        ("LOCALHOST", True),
        ("[::1]:{port}", True),
        ("10.1.2.3:{port}", True),  # an IP literal: no name an attacker could re-point
        ("fleet.example:{port}", True),  # in http_hosts, any port
        ("fleet.example", True),
        ("ops.example:8443", True),  # in http_hosts with this port
        ("ops.example:{port}", False),
        ("evil.example:{port}", False),
        ("evil.example", False),
        ("127.0.0.1.evil.example", False),
        ("localhost:x", False),
        ("::1", False),
        ("", False),
    ],
)
async def test_a_foreign_host_header_is_refused_on_every_endpoint(
    tmp_path: Path, host: str, allowed: bool
) -> None:
    """DNS rebinding: a page from evil.example, its name re-pointed at 127.0.0.1, would
    otherwise read the API as its own origin from a browser on this host."""
    r = await _start(tmp_path, http_hosts=["fleet.example", "ops.example:8443"])
    header = host.format(port=r.port)
    try:
        for path in ("/api/v1/nodes", "/metrics", "/", "/api/v1/nodes/n1"):
            status, _ = await _get(r.base + path, {"Host": header})
            assert status == (200 if allowed else 421), path
        status, _ = await _post(
            r.base + "/api/v1/nodes/n1/commands",
            b'{"command": "refresh"}',
            {**msg.AUTH, "Host": header},
        )
    finally:
        await r.agg.close()
    assert status == (202 if allowed else 421)
    assert len(r.sent) == (1 if allowed else 0)
    if not allowed:
        assert r.counters.requests_rejected == {"host": 5}
        assert r.counters.commands_rejected == {"host": 1}


def test_host_names_answered() -> None:
    names = allowed_hosts("::1", ["Fleet.Example"])
    assert names >= {"localhost", "127.0.0.1", "[::1]", "fleet.example"}
    assert host_allowed("fleet.example:1", names)
    assert not host_allowed(None, names)
    assert host_allowed("agg.mgmt:19500", allowed_hosts("agg.mgmt", []))


# --- 4. deeply nested JSON --------------------------------------------------------------


async def test_deeply_nested_json_is_a_400(running: Running) -> None:
    status, body = await _post(running.base + "/api/v1/nodes/n1/commands", NESTED, msg.AUTH)
    assert status == 400
    assert "JSON object" in body["error"]
    assert running.counters.bad_requests["commands"] == 1
    assert running.counters.commands_rejected == {"invalid": 1}
    # and the aggregator carries on
    status, _ = await _post(
        running.base + "/api/v1/nodes/n1/commands", b'{"command": "refresh"}', msg.AUTH
    )
    assert status == 202


# --- 5. timeouts and the connection cap ---------------------------------------------------


async def _closed(reader: asyncio.StreamReader, within: float) -> float:
    """When (time.monotonic()) the server closed the connection (EOF or reset); fails if
    it did not within ``within`` seconds."""
    try:
        while await asyncio.wait_for(reader.read(65536), within):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    return time.monotonic()


async def test_half_sent_requests_are_closed_after_the_header_timeout(tmp_path: Path) -> None:
    """300 connections that never finish their request line: the API keeps answering, and
    each is closed once the header timeout has passed, not before."""
    # Long enough that opening 300 connections on a busy machine ends well before it.
    timeout = 2.0
    http = AggregatorHttpSection(header_timeout_seconds=timeout, max_connections=400)
    r = await _start(tmp_path, http=http)
    writers: list[asyncio.StreamWriter] = []
    try:
        opened = time.monotonic()
        streams = [await asyncio.open_connection("127.0.0.1", r.port) for _ in range(300)]
        for _, writer in streams:
            writer.write(b"GET /api/v1/no")
            writers.append(writer)
        await asyncio.gather(*(w.drain() for w in writers))
        assert (await _get(r.base + "/api/v1/nodes"))[0] == 200
        assert time.monotonic() - opened < timeout  # answered while they hang
        closed = await asyncio.gather(*(_closed(reader, 10.0) for reader, _ in streams))
        # Each was accepted after `opened`: none may go before its timeout.
        assert min(closed) - opened >= timeout
        assert max(closed) - opened < timeout + PATIENCE
        assert r.counters.connections_rejected == {"header_timeout": 300}
        _, text = await _get(r.base + "/metrics")
    finally:
        for writer in writers:
            writer.close()
        await r.agg.close()
    samples = {
        (s.name, tuple(s.labels.values())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    key = ("gpuagent_fleet_http_connections_rejected_total", ("header_timeout",))
    assert samples[key] == 300


async def test_a_request_head_trickled_in_is_still_timed_out(tmp_path: Path) -> None:
    http = AggregatorHttpSection(header_timeout_seconds=1.0)
    r = await _start(tmp_path, http=http)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
        started = time.monotonic()
        closed = False
        for byte in b"GET /api/v1/nodes HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaa":
            try:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.wait_for(reader.read(1), 0.1)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                pass
            closed = True
            break
        assert closed
        assert 0.9 <= time.monotonic() - started < 3.0
        writer.close()
    finally:
        await r.agg.close()
    assert r.counters.connections_rejected == {"header_timeout": 1}


async def test_a_body_not_sent_in_time_is_a_408(tmp_path: Path) -> None:
    http = AggregatorHttpSection(body_timeout_seconds=1.0)
    r = await _start(tmp_path, http=http)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
        head = (
            "POST /api/v1/nodes/n1/commands HTTP/1.1\r\nHost: localhost\r\n"
            f"Authorization: Bearer {msg.COMMAND_TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        writer.write(head.encode() + b'{"command":')
        started = time.monotonic()
        answer = await asyncio.wait_for(reader.read(), 5.0)  # then closed
        waited = time.monotonic() - started
        writer.close()
    finally:
        await r.agg.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert 0.9 <= waited < 3.0
    assert r.counters.connections_rejected == {"body_timeout": 1}
    assert r.counters.commands_rejected == {"body_timeout": 1}
    assert r.sent == []


async def test_an_idle_keep_alive_connection_is_closed(tmp_path: Path) -> None:
    http = AggregatorHttpSection(keepalive_timeout_seconds=1.0, header_timeout_seconds=30.0)
    r = await _start(tmp_path, http=http)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
        writer.write(b"GET /api/v1/nodes HTTP/1.1\r\nHost: localhost\r\n\r\n")
        status = await asyncio.wait_for(reader.readline(), 5.0)
        assert status.startswith(b"HTTP/1.1 200 ")
        answered = time.monotonic()
        waited = await _closed(reader, 10.0) - answered
        writer.close()
    finally:
        await r.agg.close()
    assert 0.5 <= waited < 5.0


async def test_connections_past_the_limit_are_closed_at_accept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    http = AggregatorHttpSection(max_connections=5, header_timeout_seconds=60.0)
    r = await _start(tmp_path, http=http)
    try:
        held = [await asyncio.open_connection("127.0.0.1", r.port) for _ in range(5)]
        with caplog.at_level(logging.WARNING, logger="gpuagent.aggregator.httpguard"):
            extra = [await asyncio.open_connection("127.0.0.1", r.port) for _ in range(3)]
            for reader, _ in extra:
                await _closed(reader, 5.0)  # at once: the header timeout is a minute
        assert r.counters.connections_rejected == {"limit": 3}
        assert len([m for m in caplog.messages if "max_connections" in m]) == 1  # one episode
        # One held connection goes away: a new client is served again.
        held.pop()[1].close()
        deadline = deadline_in(5)
        while True:
            try:
                assert (await _get(r.base + "/api/v1/nodes"))[0] == 200
                break
            except aiohttp.ClientError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
        for _, writer in held + extra:
            writer.close()
    finally:
        await r.agg.close()
