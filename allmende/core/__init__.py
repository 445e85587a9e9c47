"""The core every component stands on: settings, paths, the Kafka and ClickHouse adapters,
logs, metrics and child processes."""
