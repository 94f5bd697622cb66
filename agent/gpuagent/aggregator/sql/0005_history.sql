-- Each node's history for the console's timelines (aggregator.history): its health
-- transitions and those of its GPUs, and a sample of every GPU's trend values
-- (temperature, power, utilisation, ECC and XID counts) every history_interval_seconds.
-- Kept history_retention_seconds; at most one sample per interval and a bounded number of
-- transitions per hour per node (gpuagent.aggregator.history), so a node's rows are bounded.
-- oldest_compatible: 1
CREATE TABLE IF NOT EXISTS history (
    id VARCHAR(512) PRIMARY KEY,
    cluster VARCHAR(128) NOT NULL,
    node VARCHAR(128) NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    kind VARCHAR(16) NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS history_by_time ON history (time);
CREATE INDEX IF NOT EXISTS history_by_node ON history (cluster, node, time);
