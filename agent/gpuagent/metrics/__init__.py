"""Prometheus output: dcgm-exporter-compatible and gpuagent_* metrics from the snapshot."""

from gpuagent.metrics.collector import SnapshotCollector, build_registry
from gpuagent.metrics.server import MetricsServer

__all__ = ["MetricsServer", "SnapshotCollector", "build_registry"]
