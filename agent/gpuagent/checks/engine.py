"""The engine: updates the memory with the latest poll and runs every enabled check.

The check tables below are the single place that names checks; the order of a table is
the display order. Checks are pure: the engine hands each one its view, including the
memory that already holds this poll's samples. Events are indexed once per call, so a
full event log costs one pass, not one pass per GPU and check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuagent.checks.aer import check_aer, remember_aer
from gpuagent.checks.availability import check_availability, no_data
from gpuagent.checks.bus import check_bus
from gpuagent.checks.common import EventView, GpuView, NodeView, Outcome, SinceBoot, to_finding
from gpuagent.checks.daemons import check_fabric, check_services
from gpuagent.checks.dcgm import check_dcgm, check_dcgm_node, corroborate
from gpuagent.checks.ecc import check_ecc, remember_sbe
from gpuagent.checks.eventindex import EventIndex
from gpuagent.checks.fabric_health import check_fabric_health, remember_fabric_recovery
from gpuagent.checks.infiniband import (
    IbInput,
    IbView,
    applies,
    check_infiniband,
    remember_infiniband,
)
from gpuagent.checks.inventory import (
    InventoryView,
    check_drift,
    check_driver,
    check_firmware,
    check_gpu_count,
    check_kernel_module,
    check_mig_layout,
)
from gpuagent.checks.kernel import check_kernel
from gpuagent.checks.kubernetes import KubernetesView, check_kubernetes
from gpuagent.checks.memory import GpuMemory, HealthMemory, IbMemory, MemoryChanges
from gpuagent.checks.mig import check_mig
from gpuagent.checks.nvlink import check_nvlink, remember_nvlink
from gpuagent.checks.nvml import check_nvml
from gpuagent.checks.pcie import check_pcie, remember_bridges, remember_link
from gpuagent.checks.processes import check_processes, remember_processes
from gpuagent.checks.recovery import check_recovery
from gpuagent.checks.retired_pages import check_retired_pages
from gpuagent.checks.row_remap import check_row_remap
from gpuagent.checks.same_fault import absorb, owned_xids
from gpuagent.checks.settings import (
    check_ecc_mode,
    check_persistence,
    check_settings,
    persistence_wanted,
)
from gpuagent.checks.state_dir import check_state_dir
from gpuagent.checks.sxid import check_sxid
from gpuagent.checks.thermal import check_thermal, remember_throttle
from gpuagent.checks.xid import check_xid
from gpuagent.config import ChecksSection, ExpectedGpu
from gpuagent.inventory.model import GpuInventory
from gpuagent.k8s.model import KubernetesFacts
from gpuagent.model import (
    DcgmStatus,
    Finding,
    GpuEvent,
    GpuReadings,
    GpuState,
    NodeHealth,
    NvmlStatus,
    PciePath,
    Severity,
)

AVAILABILITY = "availability"
XID = "xid"
NVML = "nvml"
STATE_DIR = "state_dir"
# Only when the DCGM source is present (configured, bindings loaded), after a GPU's other
# checks (and after the node checks): see checks/dcgm.py. Not in the tables below, which
# list the checks every node runs.
DCGM = "dcgm"
# Only when the sysfs source reads RDMA devices and the node has some (or expects some),
# after the node and inventory node checks: see checks/infiniband.py.
INFINIBAND = "infiniband"
# Only when the Kubernetes GPU stack is watched (checks.kubernetes): see checks/kubernetes.py.
KUBERNETES = "kubernetes"


@dataclass(frozen=True, slots=True)
class ReadingsCheck:
    """A per-GPU check that needs readings; ``enabled`` picks its switch from the config."""

    name: str
    enabled: Callable[[ChecksSection], bool]
    run: Callable[[GpuView], Outcome]


@dataclass(frozen=True, slots=True)
class EventCheck:
    """A per-GPU check of events and sysfs: it runs whether or not NVML served readings."""

    name: str
    enabled: Callable[[ChecksSection], bool]
    run: Callable[[EventView], Outcome]


@dataclass(frozen=True, slots=True)
class NodeCheck:
    name: str
    enabled: Callable[[ChecksSection], bool]
    run: Callable[[NodeView], Outcome]


GPU_CHECKS: tuple[ReadingsCheck | EventCheck, ...] = (
    # Is the GPU there at all, then the faults the driver reported, then the hardware.
    EventCheck("bus", lambda c: c.bus.enabled, check_bus),
    EventCheck(XID, lambda c: c.xid.enabled, check_xid),
    # Retired pages and row remapping are ECC's bookkeeping, so the ECC switch covers them.
    ReadingsCheck("ecc", lambda c: c.ecc.enabled, check_ecc),
    ReadingsCheck("retired_pages", lambda c: c.ecc.enabled, check_retired_pages),
    ReadingsCheck("row_remap", lambda c: c.ecc.enabled, check_row_remap),
    ReadingsCheck("recovery", lambda c: c.recovery.enabled, check_recovery),
    ReadingsCheck("fabric_health", lambda c: c.fabric_health.enabled, check_fabric_health),
    ReadingsCheck("thermal", lambda c: c.thermal.enabled, check_thermal),
    ReadingsCheck("pcie", lambda c: c.pcie.enabled, check_pcie),
    EventCheck("aer", lambda c: c.aer.enabled, check_aer),
    ReadingsCheck("persistence", lambda c: c.persistence.enabled, check_persistence),
    ReadingsCheck("mig", lambda c: c.mig.enabled, check_mig),
    ReadingsCheck("nvlink", lambda c: c.nvlink.enabled, check_nvlink),
    ReadingsCheck("processes", lambda c: c.processes.enabled, check_processes),
)

NODE_CHECKS: tuple[NodeCheck, ...] = (
    NodeCheck("sxid", lambda c: c.sxid.enabled, check_sxid),
    NodeCheck("kernel", lambda _: True, check_kernel),
)


@dataclass(frozen=True, slots=True)
class InventoryNodeCheck:
    name: str
    run: Callable[[InventoryView], Outcome]


@dataclass(frozen=True, slots=True)
class InventoryGpuCheck:
    """A per-GPU inventory check; like a readings check it needs the GPU to answer."""

    name: str
    run: Callable[[GpuInventory, InventoryView, ChecksSection], Outcome]


# Run only when the daemon has an inventory (`inventory.enabled`), after the checks above.
INVENTORY_NODE_CHECKS: tuple[InventoryNodeCheck, ...] = (
    # Is everything there and loaded, then is it running, then is it the right version.
    InventoryNodeCheck("gpu_count", check_gpu_count),
    InventoryNodeCheck("driver", check_driver),
    InventoryNodeCheck("kernel_module", check_kernel_module),
    InventoryNodeCheck("fabric", check_fabric),
    InventoryNodeCheck("services", check_services),
    InventoryNodeCheck("firmware", check_firmware),
    InventoryNodeCheck("drift", check_drift),
)
INVENTORY_GPU_CHECKS: tuple[InventoryGpuCheck, ...] = (
    InventoryGpuCheck("ecc_mode", check_ecc_mode),
    InventoryGpuCheck("mig_layout", check_mig_layout),
    InventoryGpuCheck("settings", check_settings),
)

# The kernel-log kinds drills write (gpuagent.drills) or a real fault beside them would,
# and the checks that judge them.
_DRILL_KINDS = ("xid", "gsp", "aer", "fallen_off_bus")
_DRILLED_CHECKS = frozenset({XID, "aer", "bus", "sxid"})

CHECK_NAMES: tuple[str, ...] = (AVAILABILITY, *(c.name for c in GPU_CHECKS))
NODE_CHECK_NAMES: tuple[str, ...] = (NVML, *(c.name for c in NODE_CHECKS), STATE_DIR)
INVENTORY_CHECK_NAMES: tuple[str, ...] = tuple(c.name for c in INVENTORY_GPU_CHECKS)
INVENTORY_NODE_CHECK_NAMES: tuple[str, ...] = tuple(c.name for c in INVENTORY_NODE_CHECKS)


@dataclass(frozen=True, slots=True)
class _Context:
    """What every GPU's evaluation shares in one call."""

    config: ChecksSection
    now: float
    events: EventIndex
    paths: dict[str, PciePath]
    inventory: InventoryView | None = None
    # GPUs (by index) whose checks run with their own MIG expectation.
    gpu_configs: dict[int, ChecksSection] = field(default_factory=dict)
    storage_errors: tuple[tuple[str, str], ...] = ()
    dcgm: DcgmStatus | None = None  # None, or "absent": no dcgm findings at all
    boot: SinceBoot | None = None  # None: when the node booted is not known

    @property
    def dcgm_present(self) -> bool:
        return self.dcgm is not None and self.dcgm.state != "absent"

    def config_for(self, index: int) -> ChecksSection:
        return self.gpu_configs.get(index, self.config)


def _gpu_configs(config: ChecksSection, gpus: Sequence[ExpectedGpu]) -> dict[int, ChecksSection]:
    """The checks configuration of each GPU whose MIG mode expectation is its own."""
    return {
        gpu.index: replace(config, mig=replace(config.mig, expected=gpu.mig_mode))
        for gpu in gpus
        if gpu.mig_mode is not None
    }


def _remember(
    previous: GpuMemory,
    state: GpuState,
    readings: GpuReadings | None,
    path: PciePath | None,
    context: _Context,
) -> GpuMemory:
    # A disabled check's memory stays empty: nothing would ever read it.
    config, now = context.config, context.now
    changes = MemoryChanges()
    if config.ecc.enabled:
        changes.update(remember_sbe(previous, readings, config.ecc, now))
    if config.pcie.enabled:
        changes.update(remember_link(previous, state.identity, readings, config.pcie, now))
        changes.update(remember_bridges(previous, path, readings, config.pcie, now))
    if config.aer.enabled:
        changes.update(remember_aer(previous, path, config.aer, now))
    if config.thermal.enabled:
        changes.update(remember_throttle(previous, readings, config.thermal, now))
    if config.fabric_health.enabled:
        changes.update(remember_fabric_recovery(previous, readings, now))
    if config.nvlink.enabled:
        changes.update(remember_nvlink(previous, readings, config.nvlink, now))
    if config.processes.enabled:
        changes.update(remember_processes(previous, readings, config.processes, now))
    return replace(previous, **changes) if changes else previous


def _gpu_findings(
    state: GpuState,
    readings: GpuReadings | None,
    path: PciePath | None,
    memory: GpuMemory,
    context: _Context,
) -> list[Finding]:
    bus_id, now = state.identity.pci_bus_id, context.now
    config = context.config_for(state.identity.index)
    events = EventView(state.identity, readings, config, memory, now, context.events, path)
    wanted = persistence_wanted(state.identity.index, context.inventory)
    view = (
        None
        if readings is None
        else GpuView(state.identity, readings, config, memory, now, path, wanted, context.boot)
    )
    enabled = [check for check in GPU_CHECKS if check.enabled(config)]
    # None: the check needs readings the GPU did not serve (its finding is masked).
    outcomes: dict[str, Outcome | None] = {AVAILABILITY: check_availability(state)}
    xids = context.events.for_device(bus_id, "xid")
    owned: dict[int, str] = {}
    # xid runs after the checks that may own a fault it sees too (checks/same_fault.py);
    # the findings keep the table's order.
    for check in sorted(enabled, key=lambda c: c.name == XID):
        if isinstance(check, EventCheck):
            if check.name == XID:
                owned = owned_xids(outcomes, xids)
                events = replace(events, owned_xids=owned) if owned else events
            outcomes[check.name] = check.run(events)
        else:
            outcomes[check.name] = None if view is None else check.run(view)
    for owner in sorted(set(owned.values())):
        outcome = outcomes[owner]
        assert outcome is not None  # it owns an XID because its outcome reports the fault
        outcomes[owner] = absorb(outcome, owner, owned, xids, context.events.weight)
    findings = [
        to_finding(name, bus_id, outcome)
        if (outcome := outcomes[name]) is not None
        else _masked(name, bus_id, state)
        for name in (AVAILABILITY, *(check.name for check in enabled))
    ]
    if context.dcgm_present:
        assert context.dcgm is not None
        mine = [i for i in context.dcgm.incidents if i.gpu == bus_id]
        findings, left = corroborate(findings, mine)
        down = context.dcgm.state == "down"
        outcome = check_dcgm(left, len(mine) - len(left), down=down)
        findings.append(to_finding(DCGM, bus_id, outcome))
    findings.extend(_gpu_inventory_findings(state, readings, context))
    drills = [e for kind in _DRILL_KINDS for e in context.events.for_device(bus_id, kind)]
    return _marked_drills(findings, drills)


def _marked_drills(findings: list[Finding], events: Sequence[GpuEvent]) -> list[Finding]:
    """A kernel-log check's problem that only drills' events stand behind says DRILL: an
    operator practising must not be taken for a fault. One real event among them, and it
    is a fault like any other."""
    if not events or any(event.source != "drill" for event in events):
        return findings
    return [
        replace(f, reason=f"DRILL: {f.reason}", drill=True)
        if f.check in _DRILLED_CHECKS and f.severity is not Severity.OK and not f.masked
        else f
        for f in findings
    ]


def _gpu_inventory_findings(
    state: GpuState, readings: GpuReadings | None, context: _Context
) -> list[Finding]:
    view = context.inventory
    if view is None:
        return []
    bus_id = state.identity.pci_bus_id
    gpu = next((g for g in view.inventory.gpus if g.pci_bus_id == bus_id), None)
    return [
        _masked(check.name, bus_id, state)
        if readings is None or gpu is None
        else to_finding(check.name, bus_id, check.run(gpu, view, context.config))
        for check in INVENTORY_GPU_CHECKS
    ]


def _masked(check: str, bus_id: str, state: GpuState) -> Finding:
    """A check's finding for a GPU that gave no readings: UNKNOWN, masked by availability."""
    return replace(to_finding(check, bus_id, no_data(state)), masked=True)


def _node_findings(
    nvml: NvmlStatus, gpus: tuple[GpuState, ...], context: _Context
) -> list[Finding]:
    bus_ids = frozenset(state.identity.pci_bus_id for state in gpus)
    view = NodeView(context.config, context.now, context.events, bus_ids)
    findings = [to_finding(NVML, None, check_nvml(nvml))]
    findings += [
        to_finding(check.name, None, check.run(view))
        for check in NODE_CHECKS
        if check.enabled(context.config)
    ]
    findings = _marked_drills(findings, context.events.of_kind("sxid"))
    findings.append(to_finding(STATE_DIR, None, check_state_dir(context.storage_errors)))
    if context.dcgm_present:
        assert context.dcgm is not None
        node = [i for i in context.dcgm.incidents if i.gpu is None or i.gpu not in bus_ids]
        findings.append(to_finding(DCGM, None, check_dcgm_node(node, context.dcgm)))
    if context.inventory is not None:
        findings += [
            to_finding(check.name, None, check.run(context.inventory))
            for check in INVENTORY_NODE_CHECKS
        ]
    return findings


def evaluate(
    gpus: tuple[GpuState, ...],
    nvml: NvmlStatus,
    config: ChecksSection,
    memory: HealthMemory,
    now: float,
    *,
    events: tuple[GpuEvent, ...] = (),
    weights: Mapping[str, int] | None = None,
    pcie: tuple[PciePath, ...] = (),
    inventory: InventoryView | None = None,
    expected_gpus: Sequence[ExpectedGpu] = (),
    storage_errors: tuple[tuple[str, str], ...] = (),
    dcgm: DcgmStatus | None = None,
    infiniband: IbInput | None = None,
    kubernetes: KubernetesFacts | None = None,
    booted_at: float | None = None,
) -> tuple[NodeHealth, HealthMemory]:
    """Findings for the node and every GPU, plus the memory to pass to the next call.

    ``now`` is monotonic seconds, the clock of ``GpuEvent.monotonic``. ``events`` are the
    recent events, oldest first, and ``weights`` the records of a storm folded onto some
    of them (`EventLog.weights`); ``pcie`` the sysfs view of each GPU's PCIe path;
    ``inventory`` the node inventory with its expectations (None: no inventory checks);
    ``expected_gpus`` the GPUs whose MIG mode is expected to differ from ``config.mig``;
    ``storage_errors`` (store, error) for each of the agent's stores that cannot be used;
    ``dcgm`` the DCGM source's status (its incidents make the ``dcgm`` findings);
    ``infiniband`` the RDMA devices and expectations (None: no ``infiniband`` finding);
    ``kubernetes`` the node's Kubernetes GPU stack (None: no ``kubernetes`` finding; it
    comes last among the node findings, judged on the GPUs' own findings);
    ``booted_at`` when the node booted, on ``now``'s clock (None: not known, so no
    post-boot grace for NVLinks and the fabric, ``checks.nvlink.boot_grace_seconds``).
    Findings come node first (in ``NODE_CHECK_NAMES`` order, then
    ``INVENTORY_NODE_CHECK_NAMES``, then ``infiniband``), then GPU by GPU in the order
    given, each in ``CHECK_NAMES`` order followed by ``INVENTORY_CHECK_NAMES``.
    """
    paths = {path.device.address: path for path in pcie}
    boot = None
    if booted_at is not None:
        boot = SinceBoot(now - booted_at, config.nvlink.boot_grace_seconds)
        inventory = replace(inventory, boot=boot) if inventory is not None else None
    context = _Context(
        config,
        now,
        EventIndex(events, weights),
        paths,
        inventory,
        _gpu_configs(config, expected_gpus),
        storage_errors,
        dcgm,
        boot,
    )
    findings = _node_findings(nvml, gpus, context)
    ib_memory = _infiniband(infiniband, config, memory.infiniband, now, findings)
    node_findings = len(findings)
    remembered: dict[str, GpuMemory] = {}
    for state in gpus:
        bus_id = state.identity.pci_bus_id
        # Readings from a GPU NVML does not call healthy are never trusted.
        readings = state.readings if state.status == "ok" else None
        path = paths.get(bus_id)
        gpu_memory = _remember(memory.for_gpu(bus_id), state, readings, path, context)
        remembered[bus_id] = gpu_memory
        findings.extend(_gpu_findings(state, readings, path, gpu_memory, context))
    if kubernetes is not None:
        findings.insert(node_findings, _kubernetes(kubernetes, gpus, findings, context))
    # Only GPUs present in this poll are kept, so removed GPUs do not linger.
    return NodeHealth(tuple(findings)), HealthMemory(tuple(remembered.items()), ib_memory)


def _kubernetes(
    facts: KubernetesFacts,
    gpus: tuple[GpuState, ...],
    findings: list[Finding],
    context: _Context,
) -> Finding:
    """The ``kubernetes`` finding: healthy GPUs are those without a CRITICAL finding."""
    unhealthy = frozenset(
        f.gpu for f in findings if f.gpu is not None and f.severity is Severity.CRITICAL
    )
    identities = tuple(state.identity for state in gpus)
    view = KubernetesView(facts, context.config.kubernetes, context.now, identities, unhealthy)
    return to_finding(KUBERNETES, None, check_kubernetes(view))


def _infiniband(
    given: IbInput | None,
    config: ChecksSection,
    memory: IbMemory,
    now: float,
    findings: list[Finding],
) -> IbMemory:
    """Append the ``infiniband`` finding when there is something to judge; the memory."""
    if given is None or not config.infiniband.enabled:
        return IbMemory()
    remembered = remember_infiniband(memory, given.devices, config.infiniband, now)
    view = IbView(
        given.devices, remembered, config.infiniband, given.expected, given.peermem_loaded
    )
    if applies(view):
        findings.append(to_finding(INFINIBAND, None, check_infiniband(view)))
    return remembered
