"""Configuration: TOML, validated at load against frozen dataclasses.

- `gpuagent.config.schema`: the dataclasses, one per table, each numeric key with its
  allowed range (`gpuagent.config.ranges`);
- `gpuagent.config.loader`: TOML → dataclasses, checking types and ranges and collecting
  every problem;
- `gpuagent.config.rules`: names, addresses and rules that span keys;
- `gpuagent.config.errors`: `ConfigError` (each problem names the dotted key and, where
  the key appears in the file, its line) and finding a key's line.

`gpuagent config check` and `gpuagent run` print every problem, one a line, and exit 2.
"""

from __future__ import annotations

from gpuagent.config import schema as _schema
from gpuagent.config.errors import ConfigError, find_line
from gpuagent.config.loader import (
    build_dataclass,
    load_config,
    parse_config,
    parse_toml,
    read_text,
)
from gpuagent.config.ranges import Range

# The schema's names are the package's, as they were before the split.
from gpuagent.config.schema import *  # noqa: F403

# Private, but imported from here by tests that start from the default rules.
from gpuagent.config.schema.remediation import _default_rules as _default_rules

__all__ = [  # noqa: PLE0604 - the schema's __all__ is all str
    *_schema.__all__,
    "ConfigError",
    "Range",
    "build_dataclass",
    "find_line",
    "load_config",
    "parse_config",
    "parse_toml",
    "read_text",
]
