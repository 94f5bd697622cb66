"""[sources.dcgm]: NVIDIA DCGM, used when its Python bindings import (see docs/dcgm.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from gpuagent.config.ranges import POSITIVE


@dataclass(frozen=True)
class DcgmSourceSection:
    # Use DCGM when its bindings import; a node without them runs exactly as without this.
    enabled: bool = True
    # Where the bindings are; empty: DCGM 4's, then DCGM 3's installation directory.
    bindings_path: str = ""
    # "" or "localhost": the local nv-hostengine (127.0.0.1:5555); "HOST:PORT";
    # "unix:/PATH" (its unix socket); "embedded": a host engine inside the agent.
    hostengine: str = ""
    # Every DCGM call runs on one thread; one that takes longer counts as a host engine down.
    call_timeout_seconds: Annotated[float, POSITIVE] = 5.0
    health_interval_seconds: Annotated[float, POSITIVE] = 10.0
    profiling_interval_seconds: Annotated[float, POSITIVE] = 10.0
    # Reconnecting waits 1 s, then twice as long each time, up to this.
    reconnect_max_seconds: Annotated[float, POSITIVE] = 60.0
