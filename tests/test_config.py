from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings

import gpuagent.config
from gpuagent.config import Config, ConfigError, Range, find_line, load_config, parse_config
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
        (
            "[aggregator.alertmanager]\nurl = 'alertmanager:9093'\n",
            "aggregator.alertmanager.url",
            2,
            "absolute http(s) URL",
        ),
        (
            "[aggregator.alertmanager]\n\nnode_labels = []\n",
            "aggregator.alertmanager.node_labels",
            3,
            "must name a label",
        ),
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
        # To Python 1 == True; in TOML 1 is no boolean.
        ("[checks.kubernetes]\nenabled = 1\n", "checks.kubernetes.enabled", 2, "got int 1"),
        *(
            (
                f"[outputs.kubernetes]\nsummary_condition = '{kind}'\n",
                "outputs.kubernetes.summary_condition",
                2,
                "condition type",
            )
            for kind in ("", "Gpu Healthy", "-Gpu", "a/b")
        ),
        (
            "[outputs.kubernetes]\nsummary_condition = 'GpuLost'\n",
            "outputs.kubernetes.summary_condition",
            2,
            "problem conditions",
        ),
        (
            (
                "[[remediation.rules]]\ncheck = 'xid'\nactions = ['cordon']\n"
                "finding_actions = ['drain_and_reboot', 'reboot_now']\n"
            ),
            "remediation.rules.finding_actions",
            4,
            "got str 'reboot_now'",
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


def _gpuagent(*args: str, module: str = "gpuagent") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, check=False
    )


def test_config_check_command_accepts_the_example() -> None:
    result = _gpuagent("config", "check", str(REPO / "config.example.toml"))
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


# `check` exits 3 (UNKNOWN), not 2: its 2 is CRITICAL, and drains a node.
@pytest.mark.parametrize(
    ("command", "code"),
    [(["config", "check"], 2), (["run", "--config"], 2), (["check", "--config"], 3)],
)
def test_invalid_config_exits_without_traceback(
    tmp_path: Path, command: list[str], code: int
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent]\ncluster = 'a'\n\n[sources.nvml]\ncall_timeout_seconds = 'slow'\n")
    result = _gpuagent(*command, str(bad))
    assert result.returncode == code
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
    # message (exit 2), never another exception (a traceback); with several problems,
    # each is on a line of its own, naming its key or line.
    try:
        parse_config(text)
    except ConfigError as exc:
        problems = exc.problems
        assert problems
        assert all(p.key or p.line is not None for p in problems)
        lines = str(exc).splitlines()
        assert len(lines) == (1 if len(problems) == 1 else len(problems) + 1)


# --- ranges: every numeric key declares one, in the schema ---------------------------------


def _numeric_fields(cls: type, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, hint) for every int or float in the schema, list items included."""
    found: list[tuple[str, object]] = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        found += _numeric_hints(hints[f.name], f"{prefix}{f.name}")
    return found


def _numeric_hints(hint: object, key: str) -> list[tuple[str, object]]:
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        base = typing.get_args(hint)[0]
        return [(key, hint)] if base in (int, float) else _numeric_hints(base, key)
    if dataclasses.is_dataclass(hint):
        return _numeric_fields(typing.cast("type", hint), f"{key}.")
    if origin in (list, types.UnionType, typing.Union):
        return [h for arg in typing.get_args(hint) for h in _numeric_hints(arg, key)]
    return [(key, hint)] if hint in (int, float) else []


def _declared_range(hint: object) -> Range | None:
    if typing.get_origin(hint) is not typing.Annotated:
        return None
    return next((m for m in typing.get_args(hint)[1:] if isinstance(m, Range)), None)


def test_every_numeric_key_declares_its_range() -> None:
    numeric = _numeric_fields(Config)
    assert len(numeric) > 60  # the walk reaches every table (and list items: xids)
    assert "remediation.rules.xids" in dict(numeric)
    missing = [key for key, hint in numeric if _declared_range(hint) is None]
    assert missing == []


def test_every_default_is_inside_its_range() -> None:
    def values(obj: object, prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for f in dataclasses.fields(obj):  # type: ignore[arg-type]
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                out |= values(value, f"{prefix}{f.name}.")
            else:
                out[f"{prefix}{f.name}"] = value
        return out

    defaults = values(Config())
    for key, hint in _numeric_fields(Config):
        bounds = _declared_range(hint)
        assert bounds is not None
        value = defaults.get(key)
        if isinstance(value, int | float):
            assert bounds.problem(value) is None, key


# The safety rails: each value would switch one off; each is refused, naming key and line.
SAFETY_RAILS = [
    ("[remediation.power]\ncap_fraction = 7.5\n", "remediation.power.cap_fraction", 2),
    ("[remediation.reset]\ntimeout_seconds = -1\n", "remediation.reset.timeout_seconds", 2),
    ("[remediation.budgets]\nreset_per_gpu = -3\n", "remediation.budgets.reset_per_gpu", 2),
    (
        "[remediation.budgets]\n\ncooldown_seconds = -10\n",
        "remediation.budgets.cooldown_seconds",
        3,
    ),
    ("[remediation.cordon]\ntimeout_seconds = 0\n", "remediation.cordon.timeout_seconds", 2),
]


@pytest.mark.parametrize(("text", "key", "line"), SAFETY_RAILS)
def test_values_that_disable_safety_rails_exit_2(
    tmp_path: Path, text: str, key: str, line: int
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    result = _gpuagent("config", "check", str(bad))
    assert result.returncode == 2, result.stdout
    assert f"{key} (line {line}): must " in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("[remediation.reset]\nverify_polls = 0\n", "remediation.reset.verify_polls", "at least 1"),
        ("[checks.pcie]\ndegraded_min_utilization_pct = 101\n", "", "0 to 100"),
        ("[aggregator.cordon_budget]\nmax_percent = 150.0\n", "", "0 to 100"),
        ("[checks.thermal]\nfallback_shutdown_c = -5\n", "", "greater than 0"),
        ("[outputs.mqtt.broker]\nport = 0\n", "", "port number, 1 to 65535"),
        ("[aggregator.broker]\nkeepalive_seconds = 70000\n", "", "at most 65535"),
        ("[sources.nvml]\ninterval_seconds = nan\n", "", "finite number"),
        ("[remediation.cordon]\ntimeout_seconds = inf\n", "", "finite number"),
        (
            "[[remediation.rules]]\ncheck = 'xid'\nactions = ['cordon']\nxids = [79, 0]\n",
            "",
            "at least 1",
        ),
    ],
)
def test_out_of_range_values_are_refused(text: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    if key:
        assert info.value.key == key
    assert problem in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "[outputs.mqtt]\nack_timeout_seconds = 0\n",  # 0: the broker's acknowledgement
        "[remediation.budgets]\nreset_per_gpu = 0\ncooldown_seconds = 0\n",  # 0: no resets
        "[remediation.power]\ncap_fraction = 1\n",
        "[aggregator.cordon_budget]\nmax_nodes = 0\nmax_percent = 100\n",
        "[inventory.expected]\ngpus = 0\npower_limit_watts = 0\n",
        "[outputs.mqtt.broker]\nport = 65535\n",
    ],
)
def test_range_edges_that_mean_off_or_all_are_accepted(text: str) -> None:
    parse_config(text)


# --- every problem in a file, at once -------------------------------------------------------

THREE_PROBLEMS = """\
[agent]
colour = "blue"

[sources.nvml]
interval_seconds = "fast"

[remediation.power]
cap_fraction = 7.5
"""


def test_every_problem_is_collected() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(THREE_PROBLEMS)
    found = [(p.key, p.line) for p in info.value.problems]
    assert found == [
        ("agent.colour", 2),
        ("sources.nvml.interval_seconds", 5),
        ("remediation.power.cap_fraction", 8),
    ]
    # The first problem's key and line, for callers that show one.
    assert (info.value.key, info.value.line) == ("agent.colour", 2)
    assert str(info.value).splitlines() == [
        "3 problems:",
        *(f"  {p}" for p in info.value.problems),
    ]


@pytest.mark.parametrize(
    ("command", "module", "code"),
    [
        (["config", "check"], "gpuagent", 2),
        (["run", "--config"], "gpuagent", 2),
        (["check", "--config"], "gpuagent", 3),
        (["config", "check"], "gpuagent.aggregator", 2),
    ],
)
def test_every_problem_is_printed_one_a_line(
    tmp_path: Path, command: list[str], module: str, code: int
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(THREE_PROBLEMS)
    result = _gpuagent(*command, str(bad), module=module)
    assert result.returncode == code
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    for expected in (
        "agent.colour (line 2): unknown key",
        "sources.nvml.interval_seconds (line 5): expected a number",
        "remediation.power.cap_fraction (line 8): must be greater than 0 and at most 1",
    ):
        assert sum(expected in line for line in lines) == 1, result.stderr


def test_problems_in_tables_of_an_array_and_across_keys_are_all_collected() -> None:
    text = (
        "[checks.persistence]\nenabled = true\n"
        "[inventory.expected]\npersistence = 'off'\n"  # 4: not a choice
        "[[inventory.expected.gpu]]\nindex = 0\nmig_mode = 'off'\n"  # 7: not a choice
        "[[inventory.expected.gpu]]\nindex = 1\n"
        "[[inventory.expected.gpu]]\nindex = 1\n"  # 11: listed twice
        "[[remediation.rules]]\nactions = ['cordon']\n"  # 12: no check
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    found = [(p.key, p.line) for p in info.value.problems]
    assert found == [
        ("inventory.expected.persistence", 4),
        ("inventory.expected.gpu.mig_mode", 7),
        ("inventory.expected.gpu.index", 11),
        ("remediation.rules.check", 12),
    ]


def test_a_single_problem_reads_as_before() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("[agent]\nfoo = 1\n")
    assert info.value.problems == (info.value,)
    assert str(info.value).startswith("agent.foo (line 2): unknown key")


# --- structure: one job a module ------------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    [
        "gpuagent.config.errors",
        "gpuagent.config.ranges",
        "gpuagent.config.schema",
        "gpuagent.config.loader",
        "gpuagent.config.rules",
    ],
)
def test_config_is_split_into_small_modules(module: str) -> None:
    loaded = importlib.import_module(module)
    assert loaded.__file__ is not None
    for path in Path(loaded.__file__).parent.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path


def test_the_package_reexports_its_public_api() -> None:
    for name in gpuagent.config.__all__:
        assert getattr(gpuagent.config, name) is not None, name
    public = {
        "Config", "ConfigError", "Range", "build_dataclass", "find_line", "load_config",
        "parse_config", "parse_toml", "read_text", "split_listen", "DEFAULT_COMMAND_TOKEN_FILE",
    }  # fmt: skip
    assert public <= set(gpuagent.config.__all__)
