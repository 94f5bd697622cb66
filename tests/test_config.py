from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

from gpuagent.config import Config, ConfigError, find_line, load_config, parse_config
from toml_mangling import mangled_toml

REPO = Path(__file__).resolve().parent.parent


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type) or (
            isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory)
        ):
            keys += _all_keys(f.default_factory, f"{prefix}{f.name}.")  # type: ignore[arg-type]
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def test_example_config_is_valid_and_shows_the_defaults() -> None:
    assert load_config(REPO / "config.example.toml") == Config()


def test_example_config_mentions_every_key() -> None:
    text = (REPO / "config.example.toml").read_text()
    missing = [key for key in _all_keys(Config) if find_line(text, key) is None]
    assert missing == []


def test_no_file_gives_defaults() -> None:
    assert load_config(None) == Config()


def test_values_are_applied() -> None:
    config = parse_config(
        '[agent]\nnode_name = "n1"\n[sources.nvml]\ninterval_seconds = 1\n'
        '[checks.mig]\nexpected = "disabled"\n[metrics]\nlisten = "[::1]:9999"\n'
    )
    assert config.agent.resolved_node_name == "n1"
    assert config.sources.nvml.interval_seconds == 1.0
    assert config.checks.mig.expected == "disabled"
    assert config.metrics.host_port == ("::1", 9999)


@pytest.mark.parametrize(
    ("text", "key", "line", "problem"),
    [
        ("[agent]\nfoo = 1\n", "agent.foo", 2, "unknown key"),
        (
            "[sources]\n[sources.nvml]\n\ninterval_seconds = 'x'\n",
            "sources.nvml.interval_seconds",
            4,
            "expected a number",
        ),
        (
            "[sources.nvml]\ninterval_seconds = 0\n",
            "sources.nvml.interval_seconds",
            2,
            "greater than 0",
        ),
        (
            "[checks.pcie]\nreplay_rate_per_minute = -1\n",
            "checks.pcie.replay_rate_per_minute",
            2,
            "not be negative",
        ),
        ("[checks.ecc]\nenabled = 1\n", "checks.ecc.enabled", 2, "true or false"),
        ("[checks.mig]\nexpected = 'on'\n", "checks.mig.expected", 2, "one of"),
        ("[metrics]\nlisten = 'nope'\n", "metrics.listen", 2, "HOST:PORT"),
        ("[metrics]\nlisten = '1.2.3.4:70000'\n", "metrics.listen", 2, "HOST:PORT"),
        ("agent = 3\n", "agent", 1, "expected a table"),
        ("[bogus]\nx = 1\n", "bogus", 1, "unknown key"),
        (
            "sources.nvml.call_timeout_seconds = true\n",
            "sources.nvml.call_timeout_seconds",
            1,
            "expected a number",
        ),
        ("[api]\nsocket = ''\n", "api.socket", 2, "non-empty path"),
        ("[agent]\nnode_name = 'aggregator'\n", "agent.node_name", 2, "aggregator identities"),
        ("[agent]\nnode_name = 'aggregator-2'\n", "agent.node_name", 2, "aggregator identities"),
        ("[aggregator]\nshare_group = 'a/b'\n", "aggregator.share_group", 2, "one topic level"),
        *(
            (
                f"[outputs.mqtt.broker]\ntopic_prefix = '{prefix}'\n",
                "outputs.mqtt.broker.topic_prefix",
                2,
                "without wildcards",
            )
            for prefix in ("gpuagent/#", "fleet/+/x", "$SYS/gpuagent", "a//b", "/a", "")
        ),
        (
            "[agent]\n\n[[remediation.rules]]\nactions = ['cordon']\n",
            "remediation.rules.check",
            3,
            "missing required key",
        ),
    ],
)
def test_invalid_values_name_key_and_line(text: str, key: str, line: int, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert info.value.key == key
    assert info.value.line == line
    assert problem in str(info.value)


def test_toml_syntax_error_names_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("[agent]\nnode_name = \n")
    assert info.value.line == 2
    assert "invalid TOML" in str(info.value)


def _gpuagent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuagent", *args], capture_output=True, text=True, check=False
    )


def test_config_check_command_accepts_the_example() -> None:
    result = _gpuagent("config", "check", str(REPO / "config.example.toml"))
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


@pytest.mark.parametrize(
    "command", [["config", "check"], ["run", "--config"], ["check", "--config"]]
)
def test_invalid_config_exits_2_without_traceback(tmp_path: Path, command: list[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent]\ncluster = 'a'\n\n[sources.nvml]\ncall_timeout_seconds = 'slow'\n")
    result = _gpuagent(*command, str(bad))
    assert result.returncode == 2
    assert "sources.nvml.call_timeout_seconds (line 5)" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    result = _gpuagent("config", "check", str(tmp_path / "nope.toml"))
    assert result.returncode == 2
    assert "cannot read" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["a/b", "node+1", "#", "-x", "x" * 129])
def test_names_must_be_usable_as_topic_levels(name: str) -> None:
    with pytest.raises(ConfigError, match=r"agent\.node_name \(line 2\)"):
        parse_config(f'[agent]\nnode_name = "{name}"\n')


@settings(max_examples=300, deadline=None)
@given(mangled_toml((REPO / "config.example.toml").read_text()))
def test_mangled_example_configs_give_config_errors_only(text: str) -> None:
    # Whatever an operator's edit does to the example, the answer is a ConfigError with a
    # message (exit 2), never another exception (a traceback).
    with contextlib.suppress(ConfigError):
        parse_config(text)
