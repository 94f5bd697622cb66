-- What the fleet rules (gpuagent.aggregator.fleetrules) and planned maintenance keep.
--
-- gpu_history: each GPU's (and node's) facts as nodes reported them: a GPU turning
-- CRITICAL, recovering, an automatic remediation attempt, an Xid 13 with its GPC and TPC.
-- "gpu" is the GPU's UUID ("" for the node), so a GPU's history follows it across reboots
-- and nodes. Rules read one GPU's or one node's rows within their window (the indexes
-- below), never the whole table; kept aggregator.rules.history_retention_seconds.
--
-- rule_findings: what the rules concluded (a repeat offender, remediation that does not
-- work, a die defect suspected). Never read by a rule: a conclusion is not a fact.
-- oldest_compatible: 1
CREATE TABLE IF NOT EXISTS gpu_history (
    id VARCHAR(512) PRIMARY KEY,
    cluster VARCHAR(128) NOT NULL,
    node VARCHAR(128) NOT NULL,
    gpu VARCHAR(128) NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    kind VARCHAR(16) NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS gpu_history_by_gpu ON gpu_history (gpu, kind, time);
CREATE INDEX IF NOT EXISTS gpu_history_by_node ON gpu_history (cluster, node, kind, time);
CREATE INDEX IF NOT EXISTS gpu_history_by_time ON gpu_history (time);

CREATE TABLE IF NOT EXISTS rule_findings (
    id VARCHAR(512) PRIMARY KEY,
    cluster VARCHAR(128) NOT NULL,
    node VARCHAR(128) NOT NULL,
    gpu VARCHAR(128) NOT NULL,
    rule VARCHAR(32) NOT NULL,
    state VARCHAR(16) NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rule_findings_by_state ON rule_findings (state, time);
CREATE INDEX IF NOT EXISTS rule_findings_by_time ON rule_findings (time);

-- Planned maintenance windows (gpuagent.aggregator.maintenance): a domain muted from start
-- to end; "time" is the row's last change (an early end rewrites it), by which it is pruned.
CREATE TABLE IF NOT EXISTS maintenance (
    id VARCHAR(64) PRIMARY KEY,
    cluster VARCHAR(128) NOT NULL,
    domain VARCHAR(512) NOT NULL,
    start_time DOUBLE PRECISION NOT NULL,
    end_time DOUBLE PRECISION NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS maintenance_by_end ON maintenance (end_time);
