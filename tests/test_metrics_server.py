"""The HTTP endpoint: routes, gzip, OpenMetrics, IPv6, a taken port and a bounded stop."""

from __future__ import annotations

import errno
import gzip
import logging
import os
import socket
import socketserver
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from conftest import require_that
from gpuagent.metrics import MetricsServer, build_registry
from gpuagent.metrics import server as server_module
from gpuagent.metrics.exposition import TextRenderer
from test_metrics_support import (
    VERSION,
    degraded_snapshot,
    prometheus_client_text,
    registry_for,
    samples_from_text,
    snapshot,
)


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    srv = MetricsServer(registry_for(snapshot()), "127.0.0.1", 0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def url(srv: MetricsServer, path: str, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{srv.port}{path}"


def test_port_zero_binds_a_real_port(server):
    assert server.port > 0


def test_landing_page_links_to_metrics(server):
    status, headers, body = fetch(url(server, "/"))
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert b'href="metrics"' in body


def test_metrics_in_prometheus_text_format(server):
    status, headers, body = fetch(url(server, "/metrics"))
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    found = samples_from_text(body.decode())
    assert len(found["DCGM_FI_DEV_GPU_TEMP"]) == 8
    assert "gpuagent_build_info" in found


def test_unknown_paths_are_404(server):
    for path in ("/nope", "/metrics/extra", "/favicon.ico"):
        status, _headers, _body = fetch(url(server, path))
        assert status == 404, path


def test_gzip_when_asked(server):
    status, headers, body = fetch(url(server, "/metrics"), {"Accept-Encoding": "gzip"})
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    plain = fetch(url(server, "/metrics"))[2]
    assert gzip.decompress(body) == plain


def test_text_format_even_when_openmetrics_is_preferred(server):
    # Like dcgm-exporter: one format; Prometheus parses whatever Content-Type says.
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
    status, headers, body = fetch(url(server, "/metrics"), accept)
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert body == fetch(url(server, "/metrics"))[2]


def test_a_taken_port_fails_at_start_with_a_clear_message(server):
    second = MetricsServer(registry_for(None), "127.0.0.1", server.port)
    with pytest.raises(OSError, match=r"cannot serve metrics on 127\.0\.0\.1:\d+"):
        second.start()


def test_start_twice_is_an_error(server):
    with pytest.raises(RuntimeError):
        server.start()


def test_port_before_start_is_an_error():
    with pytest.raises(RuntimeError):
        _ = MetricsServer(registry_for(None), "127.0.0.1", 0).port


def test_stop_is_bounded_idempotent_and_frees_the_port():
    srv = MetricsServer(registry_for(None), "127.0.0.1", 0)
    srv.start()
    port = srv.port
    fetch(url(srv, "/metrics"))
    began = time.monotonic()
    srv.stop()
    assert time.monotonic() - began < 2.0
    srv.stop()
    again = MetricsServer(registry_for(None), "127.0.0.1", port)
    again.start()
    again.stop()


def test_stop_does_not_wait_for_a_stalled_client():
    srv = MetricsServer(registry_for(None), "127.0.0.1", 0)
    srv.start()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5):
        time.sleep(0.1)  # connected, sends nothing: its handler thread blocks on read
        began = time.monotonic()
        srv.stop()
        assert time.monotonic() - began < 2.0


def test_stop_returns_within_its_timeout_when_the_serving_thread_is_stuck(monkeypatch):
    """The daemon's stop budget hands stop() what is left of it: stop() keeps to that even
    when the serving thread does not come round to notice (it used to wait for it)."""
    stuck = threading.Event()
    release = threading.Event()

    def accept_one(self: server_module._Server) -> None:
        stuck.set()
        release.wait(10)

    monkeypatch.setattr(server_module._Server, "accept_one", accept_one)
    srv = MetricsServer(registry_for(None), "127.0.0.1", 0)
    srv.start()
    inner, thread = srv._server, srv._thread
    assert inner is not None
    assert thread is not None
    client = socket.create_connection(("127.0.0.1", srv.port))  # the serving thread takes it
    assert stuck.wait(5)
    client.close()
    began = time.monotonic()
    srv.stop(timeout=0.3)
    assert 0.3 <= time.monotonic() - began < 1.5
    release.set()
    thread.join(5)
    assert not thread.is_alive()
    inner.server_close()


def test_running_out_of_descriptors_is_logged_once_per_episode(monkeypatch, caplog):
    """accept() failing with EMFILE was dropped silently by socketserver and retried at
    once, a busy loop; now it is one line an episode and a retry every so often."""
    monkeypatch.setattr(server_module, "_ACCEPT_RETRY_SECONDS", 0.01)
    real = socketserver.TCPServer.get_request
    failures = 0

    def get_request(self: socketserver.TCPServer) -> tuple[socket.socket, object]:
        nonlocal failures
        if failures < 5:
            failures += 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(self)

    monkeypatch.setattr(socketserver.TCPServer, "get_request", get_request)
    srv = MetricsServer(registry_for(snapshot()), "127.0.0.1", 0)
    srv.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="gpuagent.metrics.server"):
            for _ in range(2):
                status, _headers, _body = fetch(url(srv, "/metrics"))
                assert status == 200
    finally:
        srv.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot accept connections: Too many open files" in m for m in messages) == 1
    assert sum("accepting connections again after 5 failed attempts" in m for m in messages) == 1


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_ipv6_host():
    require_that(_has_ipv6_loopback(), "an IPv6 loopback address (::1) to listen on")
    srv = MetricsServer(registry_for(snapshot()), "::1", 0)
    srv.start()
    try:
        status, _headers, body = fetch(url(srv, "/metrics", host="[::1]"))
    finally:
        srv.stop()
    assert status == 200
    assert b"DCGM_FI_DEV_GPU_TEMP{" in body


def test_scrapes_read_only_memory(server):
    # Every scrape of an unchanged snapshot serves identical bytes from the cached families.
    first = fetch(url(server, "/metrics"))[2]
    assert all(fetch(url(server, "/metrics"))[2] == first for _ in range(5))


# --- rendered responses are reused only while the families are the same -----------------


class _Holder:
    def __init__(self, snap):
        self.snap = snap

    def __call__(self):
        return self.snap


def _counting_renders(monkeypatch) -> list[int]:
    renders = [0]
    real = TextRenderer.render

    def counting(self, families):
        renders[0] += 1
        return real(self, families)

    monkeypatch.setattr(TextRenderer, "render", counting)
    return renders


def test_same_snapshot_is_rendered_once(monkeypatch):
    renders = _counting_renders(monkeypatch)
    srv = MetricsServer(build_registry(_Holder(snapshot()), VERSION), "127.0.0.1", 0)
    srv.start()
    try:
        plain = [fetch(url(srv, "/metrics"))[2] for _ in range(3)]
        zipped = [fetch(url(srv, "/metrics"), {"Accept-Encoding": "gzip"})[2] for _ in range(3)]
    finally:
        srv.stop()
    assert renders[0] == 1
    assert len(set(plain)) == 1
    assert len(set(zipped)) == 1
    assert gzip.decompress(zipped[0]) == plain[0]


def test_a_new_snapshot_is_served_at_once():
    holder = _Holder(snapshot())
    srv = MetricsServer(build_registry(holder, VERSION), "127.0.0.1", 0)
    srv.start()
    try:
        before = samples_from_text(fetch(url(srv, "/metrics"))[2].decode())
        holder.snap = degraded_snapshot()
        after = samples_from_text(fetch(url(srv, "/metrics"))[2].decode())
    finally:
        srv.stop()
    up = {s.labels["gpu"]: s.value for s in before["gpuagent_gpu_up"]}
    assert up["3"] == 1.0
    up = {s.labels["gpu"]: s.value for s in after["gpuagent_gpu_up"]}
    assert up["3"] == 0.0


def test_refresh_renders_ahead_of_the_scrape(monkeypatch):
    renders = _counting_renders(monkeypatch)
    holder = _Holder(snapshot())
    srv = MetricsServer(build_registry(holder, VERSION), "127.0.0.1", 0)
    srv.start()
    try:
        srv.exposition.refresh()
        assert renders[0] == 1
        fetch(url(srv, "/metrics"))
        assert renders[0] == 1
        holder.snap = degraded_snapshot()
        srv.exposition.refresh()
        fetch(url(srv, "/metrics"))
        assert renders[0] == 2
    finally:
        srv.stop()


def test_text_is_what_prometheus_client_renders():
    registry = build_registry(_Holder(degraded_snapshot()), VERSION)
    assert TextRenderer().render(registry.collect()) == prometheus_client_text(registry)


def test_label_values_are_escaped():
    registry = CollectorRegistry()
    gauge = Gauge("odd", "Help with a \\ backslash\nand a newline.", ["v"], registry=registry)
    gauge.labels(v='quote " backslash \\ newline \n').set(1)
    assert TextRenderer().render(registry.collect()) == generate_latest(registry)


def test_a_registry_of_live_metrics_is_never_replayed():
    registry = CollectorRegistry()
    gauge = Gauge("live_value", "A value that changes between scrapes.", registry=registry)
    srv = MetricsServer(registry, "127.0.0.1", 0)
    srv.start()
    try:
        gauge.set(1)
        first = fetch(url(srv, "/metrics"))[2]
        gauge.set(2)
        second = fetch(url(srv, "/metrics"))[2]
    finally:
        srv.stop()
    assert b"live_value 1.0" in first
    assert b"live_value 2.0" in second


def test_a_renderer_reused_across_changing_values_stays_exact():
    # The renderer remembers label sets and value texts between renders; neither may leak
    # a stale string into the next render.
    registry = CollectorRegistry()
    gauge = Gauge("changing", "Values and label orders that vary.", ["b", "a"], registry=registry)
    renderer = TextRenderer()
    for step, value in enumerate((0.0, 1.0, 1e-9, 123456789.0, float("inf"), 2.5, 1.0)):
        gauge.labels(b=str(step % 2), a="x").set(value)
        gauge.labels(a="y", b="z").set(-value)
        assert renderer.render(registry.collect()) == generate_latest(registry)


def test_the_renderers_memo_holds_two_renders_at_most():
    # A gauge that moves every poll goes through endless values; the memo must not keep
    # them all, only what the last two renders formatted.
    registry = CollectorRegistry()
    gauge = Gauge("moving", "A value that changes every render.", ["gpu"], registry=registry)
    renderer = TextRenderer()
    for step in range(1, 500):
        for gpu in range(8):
            gauge.labels(gpu=str(gpu)).set(step * 8 + gpu + 0.5)
        assert renderer.render(registry.collect()) == generate_latest(registry)
        remembered = len(renderer._values) + len(renderer._previous_values)
        assert remembered <= 2 * 8 + 2  # the samples and the family's _created, twice
