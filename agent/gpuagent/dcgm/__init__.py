"""DCGM, when it is installed: health watches, policy notifications, profiling fields and
diagnostics through NVIDIA's Python bindings (see docs/dcgm.md)."""
