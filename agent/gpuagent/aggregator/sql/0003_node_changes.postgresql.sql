-- Which transaction last wrote each node row, so that every aggregator sharing the
-- database can read what the others wrote since it last looked (store.NodeChanges): a row
-- it has not seen was written by a transaction not yet committed when it last looked,
-- whose id is at least that snapshot's xmin. A trigger sets it, so writers, old and new,
-- need not know the column. PostgreSQL only: SQLite is never shared.
-- oldest_compatible: 1
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS changed xid8 NOT NULL DEFAULT pg_current_xact_id();

CREATE OR REPLACE FUNCTION gpuagent_node_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed := pg_current_xact_id();
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS nodes_changed ON nodes;
CREATE TRIGGER nodes_changed BEFORE INSERT OR UPDATE ON nodes
    FOR EACH ROW EXECUTE FUNCTION gpuagent_node_changed();

CREATE INDEX IF NOT EXISTS nodes_by_change ON nodes (changed);
