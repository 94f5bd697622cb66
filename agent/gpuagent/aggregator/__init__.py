"""The fleet aggregator: consumes node reports over MQTT, keeps fleet state in SQLite,
serves a JSON API, a fleet page and fleet metrics, and arbitrates cordon requests."""
