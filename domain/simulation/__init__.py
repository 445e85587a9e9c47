"""A deterministic discrete-event GPU cluster simulator (pure: no Kafka, no ClickHouse, no clock).

- `model`: the simulated jobs, the policy's answers and the engine's records;
- `cluster`: hosts of 8 GPUs, first-fit placement, host health;
- `interfaces`: the `Policy` and `Sink` protocols and the read-only `SimView` a policy decides on;
- `lifecycle`: the job events (schemas/events.py) a run produces, with deterministic ids;
- `engine`: the event loop (`Simulation`, `simulate`);
- `from_plan`: clusters and project shares of a plan file;
- `baseline`: the static-priority policy the platform replaces;
- `behaviours`: seeded field behaviours (placeholders, priority inflation, interactive, bad hosts);
- `report` / `render`: the figures of one run, and tables of one or two runs.

An adapter drives the real platform by implementing `Policy` (ask the admission service) and
`Sink` (publish to Kafka); everything here stays synchronous and seeded.
"""
