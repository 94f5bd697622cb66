-- Fleet incidents (gpuagent.aggregator.correlate): one row per incident, its JSON document
-- rewritten as it grows; "time" is its last change, by which it is listed and pruned
-- (aggregator.correlation.retention_seconds), so a listing reads only its window.
-- oldest_compatible: 1
CREATE TABLE IF NOT EXISTS incidents (
    id VARCHAR(64) PRIMARY KEY,
    cluster VARCHAR(128) NOT NULL,
    domain VARCHAR(512) NOT NULL,
    state VARCHAR(16) NOT NULL,
    first_time DOUBLE PRECISION NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_by_time ON incidents (time);
