"""Rules beyond types and ranges: names, addresses and profile lists (one value each), and
rules that span keys (what one key says must not contradict another)."""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Collection
from urllib.parse import urlsplit

from gpuagent.config.errors import ConfigError, find_line, nth_line
from gpuagent.config.schema import Config, InventoryExpected
from gpuagent.fleet.topics import AGGREGATOR_IDENTITY, NAME_RE, is_aggregator_identity
from gpuagent.k8s.conditions import PROBLEM_CONDITIONS

# A GPU-instance profile as nvidia-smi names it: slices "g", memory "gb", and a variant.
_MIG_PROFILE_RE = re.compile(r"^[1-9]\d*g\.[1-9]\d*gb([+-][a-z]+(\.[a-z]+)?)?$")
# Levels of letters, digits, '.', '_', '-' joined by '/': no wildcard, no empty level, no
# leading '$' (reserved for the broker's own topics).
_TOPIC_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
_HTTP_HOST_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-]+)(:\d{1,5})?$")
_LISTEN_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]*):(\d{1,5})$")
# A Node condition's type as the API server accepts it: a qualified name's name part.
_CONDITION_TYPE_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
# Keys that were replaced: the loader calls them unknown; this says where they went.
_REPLACED = {
    "sources.dcgm.diag_timeout_seconds": (
        "replaced by [remediation.diag] level1_timeout_seconds, level2_timeout_seconds and "
        "level3_timeout_seconds: one limit per level, through DCGM's bindings or dcgmi alike"
    ),
    "remediation.reset.dcgm_diag": (
        "replaced by [remediation.diag]: after_reset_level = 1 runs the quick DCGM "
        "diagnostic after a reset (dcgm_diag = true), 0 runs none (dcgm_diag = false)"
    ),
}


def check_value(key: str, value: object) -> str | None:
    """A problem with the already type- and range-checked value of dotted ``key``, or None."""
    if key.startswith("inventory.expected.") and key.endswith(".mig_profiles") and value:
        odd = [p for p in typing.cast("list[str]", value) if not _MIG_PROFILE_RE.match(p)]
        if odd:
            return f'{odd[0]!r} is not a GPU-instance profile name like "1g.10gb" or "1g.10gb+me"'
    if key in ("metrics.listen", "aggregator.listen"):
        match = _LISTEN_RE.match(str(value))
        if match is None or not 0 < int(match.group(2)) < 65536:
            return 'must be "HOST:PORT", e.g. "0.0.0.0:19400" or "[::1]:19400"'
    if key in _LINKS and value:
        return _check_link(key, str(value))
    if key in _ONE_KEY_RULES:
        return _ONE_KEY_RULES[key](value)
    return _check_condition_type(key, value) or _check_topic_name(key, value)


def _check_http_hosts(value: object) -> str | None:
    odd = [h for h in typing.cast("list[str]", value) if not _HTTP_HOST_RE.match(h)]
    if odd:
        return f'{odd[0]!r} is not a host name, "name:port", "[v6 address]" or "[...]:port"'
    return None


def _check_node_labels(value: object) -> str | None:
    return None if value else 'must name a label, e.g. ["node", "Hostname", "instance"]'


def _check_condition_type(key: str, value: object) -> str | None:
    if key != "outputs.kubernetes.summary_condition":
        return None
    if not _CONDITION_TYPE_RE.match(str(value)):
        return 'must be a condition type like "GpuHealthy" (letters, digits, ".", "_", "-")'
    if value in PROBLEM_CONDITIONS:
        return f"{value} is one of the problem conditions; the summary needs a name of its own"
    return None


# The fleet page makes links of the first two: nothing but http(s) may be clicked there.
_LINKS = (
    "aggregator.grafana_url_template",
    "aggregator.runbook_base_url",
    "aggregator.alertmanager.url",
)


def _check_link(key: str, value: str) -> str | None:
    if not value.startswith(("https://", "http://")):
        return "must be an absolute http(s) URL"
    if key == "aggregator.runbook_base_url" and not value.endswith("/"):
        return 'must end with "/" (runbooks are <base>checks.md#<runbook>)'
    return None


def _check_database(given: object) -> str | None:
    value = str(given)
    if not value:
        return 'must be a SQLite file path or a "postgresql://..." URL'
    parts = urlsplit(value)
    if parts.scheme not in ("postgresql", "postgres"):
        return None
    try:
        password = parts.password
    except ValueError:
        return "is not a valid URL"
    if password is not None or "password=" in parts.query:
        # Configuration files are readable by more people than the database should be.
        return "must not contain a password: put it in aggregator.postgres.password_file"
    return None


# A location label becomes a Prometheus label and an aggregator domain key.
_LABEL_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _check_location_labels(value: object) -> str | None:
    labels = value if isinstance(value, dict) else {}
    for name, text in labels.items():
        if not _LABEL_NAME_RE.match(name):
            return f"{name!r}: a label is 1-63 lower-case letters, digits or '_' (e.g. rack)"
        if not 0 < len(text) <= 128:
            return f"{name!r}: a value is 1-128 characters"
    return None


# Rules of one key each: the key's value to its problem, or None.
_ONE_KEY_RULES: dict[str, Callable[[object], str | None]] = {
    "agent.labels": _check_location_labels,
    "aggregator.http_hosts": _check_http_hosts,
    "aggregator.alertmanager.node_labels": _check_node_labels,
    "aggregator.database": _check_database,
}


def _check_topic_name(key: str, value: object) -> str | None:
    """Names that become MQTT topic levels and ACL user names in fleet reports."""
    if key in ("agent.node_name", "agent.cluster") and value and not NAME_RE.match(str(value)):
        return "must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
    if key == "agent.node_name" and is_aggregator_identity(str(value)):
        # The broker's ACL gives these identities the right to send commands to every node.
        return (
            f'"{AGGREGATOR_IDENTITY}" and "{AGGREGATOR_IDENTITY}-*" are aggregator identities '
            "on the broker"
        )
    if key == "aggregator.share_group" and value and not NAME_RE.match(str(value)):
        return "must be 1-128 letters, digits, '.', '_' or '-' (it is one topic level)"
    if key.endswith(".topic_prefix") and not _TOPIC_PREFIX_RE.match(str(value)):
        return 'must be topic levels without wildcards, e.g. "gpuagent/v1"'
    return None


def check_consistency(
    config: Config, text: str, invalid: Collection[str] = ()
) -> list[ConfigError]:
    """Every cross-key problem in ``config`` (read from ``text``, for the lines). Keys in
    ``invalid`` already have a problem (and hold their defaults): rules on them are skipped,
    so a wrong value is not reported twice."""
    expected = config.inventory.expected
    problems = _check_expected_gpus(expected, text)
    problems += [
        ConfigError(message, key=key, line=find_line(text, key))
        for key, message in _REPLACED.items()
        if key in invalid
    ]
    return problems


def _check_expected_gpus(expected: InventoryExpected, text: str) -> list[ConfigError]:
    problems: list[ConfigError] = []
    seen: set[int] = set()
    for gpu in expected.gpu:
        if gpu.index in seen:
            key = "inventory.expected.gpu.index"
            problems.append(
                ConfigError(
                    f"GPU {gpu.index} is listed twice",
                    key=key,
                    line=nth_line(text, key, gpu.index),
                )
            )
        seen.add(gpu.index)
        if gpu.mig_mode == "disabled" and gpu.mig_profiles:
            problems.append(
                ConfigError(
                    f"GPU {gpu.index}: GPU instances need MIG mode enabled, not disabled",
                    key="inventory.expected.gpu.mig_profiles",
                    line=nth_line(text, "inventory.expected.gpu.index", gpu.index),
                )
            )
    return problems
