"""Pure domain logic: no Kafka, no database. Tested directly."""
