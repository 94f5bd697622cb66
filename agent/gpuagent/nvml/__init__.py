"""The NVML layer: the only code that talks to pynvml."""
