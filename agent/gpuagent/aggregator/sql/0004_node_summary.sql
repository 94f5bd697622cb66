-- What the fleet view needs of a node's last report (health and findings of the node and
-- each GPU, fingerprint: records.summary_json), beside the whole document: aggregators
-- sharing a database read the others' nodes from it, a tenth of the document's size, and
-- read a document only when a node's own page asks for it. It carries the report's
-- last_seen: a row written by an aggregator from before this migration has a summary
-- that does not match its last_seen, and is read from its document instead.
-- oldest_compatible: 1
ALTER TABLE nodes ADD COLUMN summary TEXT NOT NULL DEFAULT '';
