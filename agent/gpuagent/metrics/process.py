"""The agent's own health: the standard `process_*` families, as every Prometheus client
library exports them, plus its thread count.

Sampled when a snapshot's families are built (once per poll), not per scrape, so the
rendered body stays cached between snapshots; a scrape sees values at most one poll old.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import ProcessCollector
from prometheus_client.core import Metric

from gpuagent.metrics.names import MetricSpec

# prometheus_client's collector, registered nowhere: it reads /proc/self only when asked.
_PROCESS = ProcessCollector(registry=None)
PROCESS_THREADS = MetricSpec("process_threads", "Number of OS threads in the process.")


def process_families() -> list[Metric]:
    families = list(_PROCESS.collect())
    try:
        threads = sum(1 for _ in Path("/proc/self/task").iterdir())
    except OSError:  # no procfs: no thread count, as ProcessCollector gives no others then
        return families
    family = PROCESS_THREADS.gauge()
    family.add_metric([], float(threads))
    return [*families, family]
