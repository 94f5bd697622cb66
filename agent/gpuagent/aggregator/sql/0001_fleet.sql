-- Fleet state of the gpuagent aggregator: migration 1, the tables.
-- oldest_compatible: 1
--
-- Portable SQL: only types and statements SQLite and PostgreSQL both take (VARCHAR, TEXT,
-- BOOLEAN, BIGINT, DOUBLE PRECISION; INSERT ... ON CONFLICT), so the same schema can live
-- in PostgreSQL when several aggregators share one database. JSON is kept as TEXT.

CREATE TABLE IF NOT EXISTS nodes (
    cluster VARCHAR(128) NOT NULL,
    node VARCHAR(128) NOT NULL,
    online BOOLEAN NOT NULL,
    health VARCHAR(16) NOT NULL,
    reason TEXT NOT NULL,
    last_seen DOUBLE PRECISION NOT NULL,
    agent_version TEXT NOT NULL,
    fingerprint_id VARCHAR(128) NOT NULL,
    stale BOOLEAN NOT NULL,
    -- The last online state message as received (JSON).
    document TEXT NOT NULL,
    PRIMARY KEY (cluster, node)
);

-- The id columns, and cordons.request_id, hold "<cluster>/<node>/<message id>" (store.row_key):
-- a message delivered twice is stored once, and one node's message never passes for
-- another's, nor a node's for that of a namesake in another cluster.
CREATE TABLE IF NOT EXISTS events (
    id VARCHAR(512) PRIMARY KEY,
    cluster VARCHAR(128) NOT NULL,
    node VARCHAR(128) NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    category VARCHAR(32) NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_time ON events (time);
CREATE INDEX IF NOT EXISTS events_by_node ON events (node, time);

CREATE TABLE IF NOT EXISTS actions (
    id VARCHAR(512) PRIMARY KEY,
    cluster VARCHAR(128) NOT NULL,
    node VARCHAR(128) NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS actions_by_node ON actions (node, time);

CREATE TABLE IF NOT EXISTS cordons (
    request_id VARCHAR(512) PRIMARY KEY,
    cluster VARCHAR(128) NOT NULL,
    node VARCHAR(128) NOT NULL,
    action VARCHAR(16) NOT NULL,
    decision VARCHAR(16) NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    reason TEXT NOT NULL,
    retry_after_seconds DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS cordons_by_time ON cordons (time);

CREATE TABLE IF NOT EXISTS replies (
    id VARCHAR(512) PRIMARY KEY,
    cluster VARCHAR(128) NOT NULL,
    node VARCHAR(128) NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    body TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS commands (
    id VARCHAR(512) PRIMARY KEY,
    cluster VARCHAR(128) NOT NULL,
    node VARCHAR(128) NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    command VARCHAR(64) NOT NULL,
    body TEXT NOT NULL
);
