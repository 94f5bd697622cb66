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

from gpuagent.config.errors import ConfigError, find_line
from gpuagent.config.loader import (
    build_dataclass,
    load_config,
    parse_config,
    parse_toml,
    read_text,
)
from gpuagent.config.ranges import Range
from gpuagent.config.schema import (
    DEFAULT_COMMAND_TOKEN_FILE,
    AerCheck,
    AgentSection,
    AggregatorHttpSection,
    AggregatorSection,
    ApiSection,
    BusCheck,
    ChecksSection,
    Config,
    CordonBudgetSection,
    EccCheck,
    EventsSection,
    ExpectedGpu,
    InventoryExpected,
    InventorySection,
    KmsgSourceSection,
    MetricsSection,
    MigCheck,
    MqttConnection,
    MqttOutput,
    NvlinkCheck,
    NvmlEventsSourceSection,
    NvmlSourceSection,
    OutputsSection,
    PcieCheck,
    PersistenceCheck,
    RemediationBudgets,
    RemediationCordon,
    RemediationKubernetes,
    RemediationPower,
    RemediationReset,
    RemediationRule,
    RemediationSection,
    RemediationSlurm,
    SourcesSection,
    SpoolSection,
    SxidCheck,
    SysfsSourceSection,
    TextfileOutput,
    ThermalCheck,
    UdevSourceSection,
    XidCheck,
    split_listen,
)

# Private, but imported from here by tests that start from the default rules.
from gpuagent.config.schema.remediation import _default_rules as _default_rules

__all__ = [
    "DEFAULT_COMMAND_TOKEN_FILE",
    "AerCheck",
    "AgentSection",
    "AggregatorHttpSection",
    "AggregatorSection",
    "ApiSection",
    "BusCheck",
    "ChecksSection",
    "Config",
    "ConfigError",
    "CordonBudgetSection",
    "EccCheck",
    "EventsSection",
    "ExpectedGpu",
    "InventoryExpected",
    "InventorySection",
    "KmsgSourceSection",
    "MetricsSection",
    "MigCheck",
    "MqttConnection",
    "MqttOutput",
    "NvlinkCheck",
    "NvmlEventsSourceSection",
    "NvmlSourceSection",
    "OutputsSection",
    "PcieCheck",
    "PersistenceCheck",
    "Range",
    "RemediationBudgets",
    "RemediationCordon",
    "RemediationKubernetes",
    "RemediationPower",
    "RemediationReset",
    "RemediationRule",
    "RemediationSection",
    "RemediationSlurm",
    "SourcesSection",
    "SpoolSection",
    "SxidCheck",
    "SysfsSourceSection",
    "TextfileOutput",
    "ThermalCheck",
    "UdevSourceSection",
    "XidCheck",
    "build_dataclass",
    "find_line",
    "load_config",
    "parse_config",
    "parse_toml",
    "read_text",
    "split_listen",
]
