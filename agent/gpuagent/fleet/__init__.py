"""Node ↔ aggregator over MQTT: topics, versioned payloads, the node's reporter and spool."""
