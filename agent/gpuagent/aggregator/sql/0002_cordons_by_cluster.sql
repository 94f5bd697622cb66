-- The cordon budget reads a cluster's decisions within its window, in the transaction
-- that decides the next one.
-- oldest_compatible: 1
CREATE INDEX IF NOT EXISTS cordons_by_cluster ON cordons (cluster, time);
