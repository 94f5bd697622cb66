"""The daemon's components, each with one job, wired once by gpuagent.daemon.Agent.

- poller: the NVML poll (and the NVML XID events that follow its sessions).
- sources: the event sources (kernel log, sysfs PCIe paths, udev) and the event log's intake.
- inventory: the host inventory's refresh and the learned baseline.
- publisher: checks over the latest observations, one NodeSnapshot, and its outputs.
- remediation: remediation cycles beside publishing, and the remote remediation commands.

They talk through the narrow Protocols each consumer declares, never through the Agent.
"""
