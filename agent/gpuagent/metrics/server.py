"""The /metrics HTTP endpoint (and /healthz, /readyz): a small threaded WSGI server that
reads only memory."""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import socketserver
import sys
import threading
from collections.abc import Iterable
from wsgiref.simple_server import WSGIRequestHandler
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import ThreadingWSGIServer

from gpuagent.api import OUT_OF_DESCRIPTORS, ExhaustionLog
from gpuagent.metrics.exposition import CONTENT_TYPE, Exposition
from gpuagent.metrics.probes import Probes

log = logging.getLogger(__name__)

_Address = tuple[str, int] | tuple[str, int, int, int]

_LANDING_PAGE = b"""<!DOCTYPE html>
<html>
<head><meta charset="utf-8"><title>gpuagent</title></head>
<body>
<h1>gpuagent</h1>
<p>GPU node health agent. <a href="metrics">Metrics</a></p>
</body>
</html>
"""

_STOP_JOIN_SECONDS = 5.0
# Out of descriptors, accept is tried again this often rather than in a busy loop (the
# listening socket stays readable while the connection waits in the backlog).
_ACCEPT_RETRY_SECONDS = 0.5


class _QuietHandler(WSGIRequestHandler):
    # Drop clients that connect and then stall, so they cannot pin server threads forever.
    timeout = 10

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        """Per-request access logs would flood the journal at every scrape."""


class _Server(ThreadingWSGIServer):
    """Thread-per-request WSGI server bound to the family of the address it listens on."""

    def __init__(self, address: _Address, family: int) -> None:
        self.address_family = family
        self.stopping = threading.Event()
        # stop() writes here to wake the serving thread: it sleeps until a connection or
        # a stop, rather than waking a few times a second to look (a tenth of a percent
        # of a core on an idle node). Made first: a failed bind closes the server at once.
        self._wake_reader, self._wake_writer = socket.socketpair()
        super().__init__(address, _QuietHandler)
        where = f"{self.server_name}:{self.server_port}"
        self.descriptors = ExhaustionLog(f"metrics {where}", log, _ACCEPT_RETRY_SECONDS)

    def serve(self) -> None:
        """Serve until ``stopping`` is set (see `wake`)."""
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while not self.stopping.is_set():
                for key, _ in selector.select():
                    if key.fileobj is self and not self.stopping.is_set():
                        self.accept_one()

    def accept_one(self) -> None:
        """Accept the waiting connection and hand it to a request thread (socketserver's
        handle_request without its wait)."""
        try:
            request, client_address = self.get_request()
        except OSError:
            return
        try:
            self.process_request(request, client_address)
        except (RuntimeError, OSError):  # no thread could be started for it
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def wake(self) -> None:
        """Stop serving: ``stopping`` is set and the serving thread woken, without waiting
        for it."""
        self.stopping.set()
        with contextlib.suppress(OSError):  # already closed: nothing is waiting
            self._wake_writer.send(b"x")

    def server_close(self) -> None:
        super().server_close()
        self._wake_reader.close()
        self._wake_writer.close()

    def get_request(self) -> tuple[socket.socket, object]:
        # socketserver drops a failed accept silently and selects again at once: out of
        # descriptors that is a busy loop. Log it once per episode and wait a little.
        try:
            request: tuple[socket.socket, object] = super().get_request()
        except OSError as exc:
            if exc.errno in OUT_OF_DESCRIPTORS:
                self.descriptors.failed(exc)
                self.stopping.wait(_ACCEPT_RETRY_SECONDS)
            raise
        self.descriptors.accepted()
        return request

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup that can
        # stall startup on a node with broken DNS; the WSGI environ only needs the address.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])
        self.setup_environ()

    def handle_error(self, request: object, client_address: object) -> None:  # noqa: ARG002
        # A scraper hanging up mid-response is routine; keep tracebacks out of stderr.
        log.debug("metrics request from %s failed: %r", client_address, sys.exc_info()[1])


def _router(exposition: Exposition, probes: Probes | None) -> WSGIApplication:
    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if probes is not None and path in ("/healthz", "/readyz"):
            ok, reason = probes.live() if path == "/healthz" else probes.ready()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{reason}\n".encode()]
        if path == "/metrics":
            gzipped = "gzip" in str(environ.get("HTTP_ACCEPT_ENCODING", ""))
            body = exposition.body(gzipped=gzipped)
            headers = [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))]
            if gzipped:
                headers.append(("Content-Encoding", "gzip"))
            start_response("200 OK", headers)
            return [body]
        if path == "/":
            headers = [("Content-Type", "text/html; charset=utf-8")]
            start_response("200 OK", headers)
            return [_LANDING_PAGE]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"404 Not Found: metrics are at /metrics\n"]

    return app


def _resolve(host: str, port: int) -> tuple[int, _Address]:
    """The address family and socket address for ``host`` ("::1" and "" included)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    for family, _type, _proto, _canonname, address in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and isinstance(address[0], str):
            return family, address
    raise OSError(f"no IPv4 or IPv6 address for {host!r}")


class MetricsServer:
    """Serves ``registry`` on /metrics in the text format (gzip when asked)."""

    def __init__(
        self, registry: CollectorRegistry, host: str, port: int, probes: Probes | None = None
    ) -> None:
        self.exposition = Exposition(registry)
        self._app = _router(self.exposition, probes)
        self._host = host
        self._requested_port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port: differs from the requested one when that was 0."""
        if self._server is None:
            raise RuntimeError("metrics server is not started")
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Bind now (so a taken port fails here, loudly), then serve on a daemon thread."""
        if self._server is not None:
            raise RuntimeError("metrics server is already started")
        where = f"{self._host}:{self._requested_port}"
        try:
            family, address = _resolve(self._host, self._requested_port)
            server = _Server(address, family)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise OSError(exc.errno, f"cannot serve metrics on {where}: {reason}") from exc
        server.set_app(self._app)
        self._server = server
        self._thread = threading.Thread(target=server.serve, name="gpuagent-metrics", daemon=True)
        self._thread.start()
        log.info("serving metrics on %s", where)

    def stop(self, timeout: float = _STOP_JOIN_SECONDS) -> None:
        """Stop serving and close the socket; returns within ``timeout`` seconds.

        The serving thread is woken at once. Request threads are daemons
        and are not joined, so a stalled client cannot hold us here; a serving thread that
        does not end in time is a daemon too and is left behind, socket open, for the
        process's exit to end.
        """
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.wake()
        if thread is not None:
            thread.join(max(timeout, 0.0))
            if thread.is_alive():
                log.warning("metrics server did not stop within %.1f s", timeout)
                return
        server.server_close()
