"""gpuagent: GPU node health agent."""

__version__ = "0.1.0"
