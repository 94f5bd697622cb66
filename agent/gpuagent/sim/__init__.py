"""A simulated NVIDIA driver library for running and testing the agent without a GPU.

The simulator sits beneath pynvml: `SimulatedNode.install` replaces the loaded NVML
library, so the real pynvml code runs against simulated GPUs whose faults follow a
scenario file or `SimulatedNode.inject`. See docs/simulation.md.
"""

from gpuagent.sim.faults import KINDS as FAULT_KINDS
from gpuagent.sim.node import GpuResetError, SimulatedNode
from gpuagent.sim.profiles import GpuProfile, MigProfile
from gpuagent.sim.scenario import (
    Fault,
    NodeHardware,
    NodeSpec,
    Scenario,
    load_scenario,
    parse_scenario,
    replay_scenario,
)

__all__ = [
    "FAULT_KINDS",
    "Fault",
    "GpuProfile",
    "GpuResetError",
    "MigProfile",
    "NodeHardware",
    "NodeSpec",
    "Scenario",
    "SimulatedNode",
    "load_scenario",
    "parse_scenario",
    "replay_scenario",
]
