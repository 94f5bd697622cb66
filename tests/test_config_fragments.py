"""config.d: fragments beside a configuration file, merged over it in name order, on real
files; a problem in a fragment names the fragment, its key and its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from gpuagent.config import ConfigError, load_config, parse_config
from gpuagent.config.loader import fragments_of

MAIN = """\
[agent]
cluster = "main"
labels = {rack = "r1", row = "a"}

[metrics]
listen = "0.0.0.0:19400"

[sources.nvml]
interval_seconds = 2.0
slow_interval_seconds = 20.0

[checks.kubernetes]
cdi_dirs = ["/etc/cdi", "/var/run/cdi"]
"""


def _config(tmp_path: Path, main: str = MAIN, **fragments: str) -> Path:
    """``config.toml`` with ``config.d/NAME.toml`` for each keyword (its name, ``_`` as
    ``-``), written in reverse name order: the order read must not be the order made."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.toml"
    path.write_text(main)
    directory = tmp_path / "config.d"
    directory.mkdir()
    for name, text in sorted(fragments.items(), reverse=True):
        (directory / f"{name.replace('_', '-')}.toml").write_text(text)
    return path


def test_no_directory_and_an_empty_one_change_nothing(tmp_path: Path) -> None:
    alone = tmp_path / "alone.toml"
    alone.write_text(MAIN)
    assert fragments_of(alone) == []
    assert load_config(alone) == parse_config(MAIN)
    path = _config(tmp_path)
    assert fragments_of(path) == []
    assert load_config(path) == parse_config(MAIN)


def test_tables_merge_key_by_key_and_a_later_value_replaces_an_earlier(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        f50_interval='[sources.nvml]\ninterval_seconds = 1.0\n\n[agent]\nlabels = {row = "b"}\n',
        f20_listen='[metrics]\nlisten = ":9400"\n',
    )
    config = load_config(path)
    # The fragments' keys, beside the main file's keys of the same tables.
    assert config.sources.nvml.interval_seconds == 1.0
    assert config.sources.nvml.slow_interval_seconds == 20.0
    assert config.metrics.listen == ":9400"
    assert config.agent.cluster == "main"
    # An inline table is a table: its keys merge too.
    assert config.agent.labels == {"rack": "r1", "row": "b"}


def test_fragments_apply_in_name_order(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        f10_site='[metrics]\nlisten = ":1"\n',
        f90_site='[metrics]\nlisten = ":3"\n',
        f50_site='[metrics]\nlisten = ":2"\n',
    )
    assert [p.name for p in fragments_of(path)] == [
        "f10-site.toml",
        "f50-site.toml",
        "f90-site.toml",
    ]
    assert load_config(path).metrics.listen == ":3"


def test_an_array_is_replaced_whole(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        f50_cdi='[checks.kubernetes]\ncdi_dirs = ["/host/etc/cdi"]\n',
        f60_rules='[[remediation.rules]]\ncheck = "ecc"\nactions = ["cordon"]\n',
    )
    config = load_config(path)
    assert config.checks.kubernetes.cdi_dirs == ["/host/etc/cdi"]
    # An array of tables too: the fragment's rules are all the rules.
    assert [(r.check, r.actions) for r in config.remediation.rules] == [("ecc", ["cordon"])]


def test_hidden_and_other_files_are_not_fragments(tmp_path: Path) -> None:
    """A ConfigMap volume keeps its files in ``..data``; editors leave ``.x.toml.swp``."""
    path = _config(tmp_path, f50_listen='[metrics]\nlisten = ":9400"\n')
    directory = tmp_path / "config.d"
    (directory / "..data").mkdir()
    (directory / "..data" / "f50-listen.toml").write_text("broken = [")
    (directory / ".f60-editing.toml").write_text("broken = [")
    (directory / "README").write_text("broken = [")
    (directory / "f70-dir.toml").mkdir()
    assert [p.name for p in fragments_of(path)] == ["f50-listen.toml"]
    assert load_config(path).metrics.listen == ":9400"


def test_a_bad_value_in_a_fragment_names_the_fragment_key_and_line(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        f50_nvml="# faster polling\n\n[sources.nvml]\ninterval_seconds = 0\n",
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    error = raised.value
    fragment = tmp_path / "config.d" / "f50-nvml.toml"
    assert (error.key, error.file, error.line) == ("sources.nvml.interval_seconds", fragment, 4)
    assert str(error).startswith(f"sources.nvml.interval_seconds ({fragment}, line 4): ")


def test_an_unknown_key_in_a_fragment_is_an_error_as_in_the_main_file(tmp_path: Path) -> None:
    path = _config(tmp_path, f50_typo='[metrics]\nlisten = ":9400"\nlisen = ":9401"\n')
    with pytest.raises(ConfigError, match="unknown key") as raised:
        load_config(path)
    assert raised.value.key == "metrics.lisen"
    assert (raised.value.file, raised.value.line) == (tmp_path / "config.d" / "f50-typo.toml", 3)


def test_problems_in_the_main_file_and_fragments_are_listed_each_where_it_is(
    tmp_path: Path,
) -> None:
    main = MAIN.replace("interval_seconds = 2.0", "interval_seconds = -2.0")
    path = _config(
        tmp_path,
        main,
        f20_kmsg="[sources.kmsg]\nenabled = 1\n",
        f10_metrics="[metrics]\n\nlisten = 9400\n",
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    directory = tmp_path / "config.d"
    placed = [(p.key, p.file, p.line) for p in raised.value.problems]
    assert placed == [
        # The main file's own line, with no file named: the caller names the main file.
        ("sources.nvml.interval_seconds", None, 9),
        ("metrics.listen", directory / "f10-metrics.toml", 3),
        ("sources.kmsg.enabled", directory / "f20-kmsg.toml", 2),
    ]


def test_a_value_replaced_by_a_fragment_is_judged_there_not_in_the_main_file(
    tmp_path: Path,
) -> None:
    main = MAIN.replace("interval_seconds = 2.0", "interval_seconds = -2.0")
    path = _config(tmp_path, main, f50_nvml="[sources.nvml]\ninterval_seconds = 1.0\n")
    assert load_config(path).sources.nvml.interval_seconds == 1.0
    broken = _config(tmp_path / "again", MAIN, f50_nvml="[sources.nvml]\n\ninterval_seconds = -1\n")
    with pytest.raises(ConfigError) as raised:
        load_config(broken)
    assert (raised.value.file, raised.value.line) == (
        tmp_path / "again" / "config.d" / "f50-nvml.toml",
        3,
    )


def test_a_syntax_error_in_a_fragment_names_the_fragment(tmp_path: Path) -> None:
    path = _config(tmp_path, f50_broken='[metrics]\nlisten = ":9400\n')
    with pytest.raises(ConfigError, match="invalid TOML") as raised:
        load_config(path)
    assert (raised.value.file, raised.value.line) == (tmp_path / "config.d" / "f50-broken.toml", 2)


def test_the_aggregators_file_has_its_own_directory(tmp_path: Path) -> None:
    """`<stem>.d`: aggregator.toml reads aggregator.d, not the agent's config.d."""
    path = tmp_path / "aggregator.toml"
    path.write_text('[aggregator]\nlisten = "127.0.0.1:19500"\n')
    (tmp_path / "aggregator.d").mkdir()
    (tmp_path / "aggregator.d" / "50-listen.toml").write_text(
        '[aggregator]\nlisten = "0.0.0.0:19501"\n'
    )
    (tmp_path / "config.d").mkdir()
    (tmp_path / "config.d" / "50-broken.toml").write_text("broken = [")
    assert load_config(path).aggregator.listen == "0.0.0.0:19501"


def test_run_exits_2_naming_the_fragment(tmp_path: Path) -> None:
    path = _config(tmp_path, f50_nvml="[sources.nvml]\ninterval_seconds = 0\n")
    result = run_cli("run", "--config", str(path))
    assert result.returncode == 2, result.stderr
    fragment = tmp_path / "config.d" / "f50-nvml.toml"
    assert f"sources.nvml.interval_seconds ({fragment}, line 2)" in result.stderr
    assert str(path) in result.stderr
