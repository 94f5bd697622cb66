"""The fixed words findings use: recommended actions and runbook ids.

Both are enums so a typo is a type error, and so docs/checks.md can be tested to cover
every value. Findings carry the plain string (``.value``), which is what outputs export.
"""

from __future__ import annotations

import enum


class Action(enum.StrEnum):
    """What an operator (or guarded remediation) should do about a finding."""

    NONE = "none"
    INVESTIGATE = "investigate"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    DRAIN_AND_RESET = "drain_and_reset"
    DRAIN_AND_REBOOT = "drain_and_reboot"
    CHECK_COOLING = "check_cooling"
    CHECK_POWER = "check_power"
    RESEAT_OR_REPLACE = "reseat_or_replace"
    CONTACT_SUPPORT = "contact_support"
    ENABLE_ECC = "enable_ecc"
    ENABLE_PERSISTENCE = "enable_persistence"
    SET_MIG_MODE = "set_mig_mode"
    LOAD_DRIVER = "load_driver"
    INSTALL_DRIVER = "install_driver"
    REBOOT = "reboot"
    RUN_AS_ROOT = "run_as_root"


class Runbook(enum.StrEnum):
    """Stable ids of the runbook entries in docs/checks.md; OK findings carry none."""

    NONE = ""
    GPU_LOST = "gpu-lost"
    GPU_NVML_TIMEOUT = "gpu-nvml-timeout"
    GPU_NVML_ERROR = "gpu-nvml-error"
    GPU_ECC_DBE = "gpu-ecc-dbe"
    GPU_ECC_SBE_RATE = "gpu-ecc-sbe-rate"
    GPU_ECC_DISABLED = "gpu-ecc-disabled"
    GPU_RETIRED_PAGES_PENDING = "gpu-retired-pages-pending"
    GPU_RETIRED_PAGES_LIMIT = "gpu-retired-pages-limit"
    GPU_ROW_REMAP_FAILURE = "gpu-row-remap-failure"
    GPU_ROW_REMAP_PENDING = "gpu-row-remap-pending"
    GPU_THERMAL_SHUTDOWN = "gpu-thermal-shutdown"
    GPU_THERMAL_SLOWDOWN = "gpu-thermal-slowdown"
    GPU_CLOCKS_THROTTLED = "gpu-clocks-throttled"
    GPU_MEMORY_THERMAL = "gpu-memory-thermal"
    GPU_PCIE_DEGRADED = "gpu-pcie-degraded"
    GPU_PCIE_REPLAY = "gpu-pcie-replay"
    GPU_PERSISTENCE_OFF = "gpu-persistence-off"
    GPU_MIG_MISMATCH = "gpu-mig-mismatch"
    GPU_MIG_PENDING = "gpu-mig-pending"
    GPU_NVLINK_DOWN = "gpu-nvlink-down"
    GPU_XID_RESET_REQUIRED = "gpu-xid-reset-required"
    GPU_XID_REBOOT_REQUIRED = "gpu-xid-reboot-required"
    GPU_XID_APP_ERROR = "gpu-xid-app-error"
    GPU_XID_APP_ERROR_RATE = "gpu-xid-app-error-rate"
    GPU_XID_CONTACT_SUPPORT = "gpu-xid-contact-support"
    GPU_XID_NVLINK_NONFATAL = "gpu-xid-nvlink-nonfatal"
    GPU_XID_CHECK_MECHANICALS = "gpu-xid-check-mechanicals"
    GPU_XID_UNKNOWN = "gpu-xid-unknown"
    GPU_GSP_ERROR = "gpu-gsp-error"
    GPU_FALLEN_OFF_BUS = "gpu-fallen-off-bus"
    GPU_REMOVED = "gpu-removed"
    GPU_AER_UNCORRECTABLE = "gpu-aer-uncorrectable"
    GPU_AER_CORRECTED_RATE = "gpu-aer-corrected-rate"
    GPU_PCIE_BRIDGE_DEGRADED = "gpu-pcie-bridge-degraded"
    NODE_SXID = "node-sxid"
    NODE_SXID_FATAL = "node-sxid-fatal"
    NODE_DRIVER_MISMATCH = "node-driver-mismatch"
    NODE_CRASH_DUMP = "node-crash-dump"
    NODE_GSP_ERROR = "node-gsp-error"
    NVML_DRIVER_NOT_LOADED = "nvml-driver-not-loaded"
    NVML_LIBRARY_NOT_FOUND = "nvml-library-not-found"
    NVML_VERSION_MISMATCH = "nvml-version-mismatch"
    NVML_NO_PERMISSION = "nvml-no-permission"
    NVML_TIMEOUT = "nvml-timeout"
    NVML_ERROR = "nvml-error"
