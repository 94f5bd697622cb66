"""The configuration's schema: frozen dataclasses, one per TOML table.

Each numeric key declares its allowed range in its annotation
(``Annotated[float, POSITIVE]``, see `gpuagent.config.ranges`); the loader enforces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuagent.config.schema.agent import (
    AgentSection,
    ApiSection,
    EventsSection,
    KmsgSourceSection,
    MetricsSection,
    NvmlEventsSourceSection,
    NvmlSourceSection,
    SourcesSection,
    SysfsSourceSection,
    UdevSourceSection,
    split_listen,
)
from gpuagent.config.schema.aggregator import (
    DEFAULT_COMMAND_TOKEN_FILE,
    AggregatorHttpSection,
    AggregatorSection,
    AlertmanagerSection,
    CordonBudgetSection,
    CorrelationSection,
    PostgresSection,
    RulesSection,
)
from gpuagent.config.schema.attribution import AttributionSection
from gpuagent.config.schema.checks import (
    AerCheck,
    BusCheck,
    ChecksSection,
    EccCheck,
    FabricHealthCheck,
    InfinibandCheck,
    KubernetesCheck,
    MigCheck,
    NvlinkCheck,
    PcieCheck,
    PersistenceCheck,
    ProcessesCheck,
    RecoveryCheck,
    SxidCheck,
    ThermalCheck,
    XidCheck,
    XidRepeat,
)
from gpuagent.config.schema.dcgm import DcgmSourceSection
from gpuagent.config.schema.inventory import ExpectedGpu, InventoryExpected, InventorySection
from gpuagent.config.schema.outputs import (
    MqttConnection,
    MqttOutput,
    OutputsSection,
    SpoolSection,
    TextfileOutput,
)
from gpuagent.config.schema.remediation import (
    RemediationBudgets,
    RemediationCordon,
    RemediationEvidence,
    RemediationKubernetes,
    RemediationPower,
    RemediationReset,
    RemediationRule,
    RemediationSection,
    RemediationSlurm,
)


@dataclass(frozen=True)
class Config:
    agent: AgentSection = field(default_factory=AgentSection)
    api: ApiSection = field(default_factory=ApiSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    outputs: OutputsSection = field(default_factory=OutputsSection)
    sources: SourcesSection = field(default_factory=SourcesSection)
    events: EventsSection = field(default_factory=EventsSection)
    checks: ChecksSection = field(default_factory=ChecksSection)
    inventory: InventorySection = field(default_factory=InventorySection)
    remediation: RemediationSection = field(default_factory=RemediationSection)
    aggregator: AggregatorSection = field(default_factory=AggregatorSection)
    attribution: AttributionSection = field(default_factory=AttributionSection)

    @property
    def watches_kubernetes(self) -> bool:
        """Whether this node's Kubernetes GPU stack is watched: checks.kubernetes.enabled, or
        with "auto" whether the node is cordoned through Kubernetes (so it is a Kubernetes
        node). A node without Kubernetes never gets the check."""
        enabled = self.checks.kubernetes.enabled
        if enabled == "auto":
            return "kubernetes" in self.remediation.cordon.backends
        return enabled is True


__all__ = [
    "DEFAULT_COMMAND_TOKEN_FILE",
    "AerCheck",
    "AgentSection",
    "AggregatorHttpSection",
    "AggregatorSection",
    "AlertmanagerSection",
    "ApiSection",
    "AttributionSection",
    "BusCheck",
    "ChecksSection",
    "Config",
    "CordonBudgetSection",
    "CorrelationSection",
    "DcgmSourceSection",
    "EccCheck",
    "EventsSection",
    "ExpectedGpu",
    "FabricHealthCheck",
    "InfinibandCheck",
    "InventoryExpected",
    "InventorySection",
    "KmsgSourceSection",
    "KubernetesCheck",
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
    "PostgresSection",
    "ProcessesCheck",
    "RecoveryCheck",
    "RemediationBudgets",
    "RemediationCordon",
    "RemediationEvidence",
    "RemediationKubernetes",
    "RemediationPower",
    "RemediationReset",
    "RemediationRule",
    "RemediationSection",
    "RemediationSlurm",
    "RulesSection",
    "SourcesSection",
    "SpoolSection",
    "SxidCheck",
    "SysfsSourceSection",
    "TextfileOutput",
    "ThermalCheck",
    "UdevSourceSection",
    "XidCheck",
    "XidRepeat",
    "split_listen",
]
