"""`gpuagent-aggregator` as an operator runs it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import REPO, deadline_in, free_port

AGGREGATOR = [sys.executable, "-m", "gpuagent.aggregator.cli"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AGGREGATOR, *args], capture_output=True, text=True, check=False, timeout=30
    )


def test_config_check_accepts_the_example() -> None:
    result = cli("config", "check", str(REPO / "config.example.toml"))
    assert result.returncode == 0, result.stderr
    assert "valid (listen 127.0.0.1:19500" in result.stdout


def test_an_invalid_configuration_exits_2_naming_key_and_line(tmp_path: Path) -> None:
    config = tmp_path / "aggregator.toml"
    config.write_text('[aggregator]\nlisten = "127.0.0.1:19500"\n\nmax_events = "lots"\n')
    for args in (("config", "check", str(config)), ("run", "--config", str(config))):
        result = cli(*args)
        assert result.returncode == 2
        assert "aggregator.max_events (line 4): expected an integer" in result.stderr
        assert "Traceback" not in result.stderr


def test_run_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "aggregator.toml"
    config.write_text(
        f'[aggregator]\nlisten = "127.0.0.1:{port}"\ndatabase = "{tmp_path / "fleet.sqlite"}"\n'
        f'[aggregator.broker]\nhost = "127.0.0.1"\nport = {free_port()}\ntls = false\n'
    )
    with subprocess.Popen(
        [*AGGREGATOR, "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        deadline = deadline_in(15)
        body = None
        while body is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/api/v1/nodes", timeout=1
                ) as r:
                    body = json.load(r)
            except OSError:
                time.sleep(0.1)
        assert body is not None
        assert (body["nodes"], body["counts"]["nodes"]) == ([], 0)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
        assert process.stderr is not None
        assert "Traceback" not in process.stderr.read()
    assert (tmp_path / "fleet.sqlite").exists()
