"""Blocking client for the local API; small and import-light so the CLI starts fast."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any


class ClientError(Exception):
    pass


def call(
    path: Path, method: str, params: dict[str, Any] | None = None, timeout: float = 5.0
) -> Any:
    request = json.dumps({"method": method, "params": params or {}}).encode() + b"\n"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(request)
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except FileNotFoundError:
        raise ClientError(f"no gpuagent socket at {path}: is the daemon running?") from None
    except PermissionError:
        raise ClientError(f"permission denied on {path} (try as root)") from None
    except OSError as exc:
        raise ClientError(f"cannot talk to gpuagent at {path}: {exc.strerror or exc}") from None
    try:
        response = json.loads(data)
    except json.JSONDecodeError:
        raise ClientError("gpuagent sent an invalid response") from None
    if not response.get("ok"):
        raise ClientError(str(response.get("error", "request failed")))
    return response.get("result")
