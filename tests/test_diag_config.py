"""[remediation.diag]: its defaults, its ranges, and the key it replaced."""

from __future__ import annotations

import pytest

from gpuagent.config import ConfigError, parse_config


def test_defaults_and_values() -> None:
    diag = parse_config("").remediation.diag
    assert (diag.after_reset_level, diag.before_uncordon_level, diag.when_unavailable) == (
        1,
        1,
        "pass",
    )
    assert [diag.timeout(level) for level in (1, 2, 3)] == [300.0, 1800.0, 7200.0]
    diag = parse_config(
        "[remediation.diag]\nafter_reset_level = 3\nbefore_uncordon_level = 0\n"
        'when_unavailable = "block"\nlevel3_timeout_seconds = 60\n'
    ).remediation.diag
    assert (diag.after_reset_level, diag.before_uncordon_level, diag.when_unavailable) == (
        3,
        0,
        "block",
    )
    assert diag.timeout(3) == 60.0


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[remediation.diag]\nafter_reset_level = 4\n", "must be 0 to 3"),
        ("[remediation.diag]\nbefore_uncordon_level = -1\n", "must be 0 to 3"),
        ('[remediation.diag]\nwhen_unavailable = "maybe"\n', "pass"),
        ("[remediation.diag]\nlevel1_timeout_seconds = 0\n", "greater than 0"),
    ],
)
def test_bad_values(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(text)


@pytest.mark.parametrize("value", ["true", "false"])
def test_the_replaced_key_says_where_it_went(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"[remediation.reset]\nverify_polls = 3\ndcgm_diag = {value}\n")
    message = str(info.value)
    assert "remediation.reset.dcgm_diag (line 3): replaced by [remediation.diag]" in message
    assert "after_reset_level" in message


def test_the_dcgm_sources_diagnostic_limit_says_where_it_went() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("[sources.dcgm]\nenabled = true\ndiag_timeout_seconds = 3600\n")
    message = str(info.value)
    assert "sources.dcgm.diag_timeout_seconds (line 3): replaced by [remediation.diag]" in message
    assert "level3_timeout_seconds" in message
