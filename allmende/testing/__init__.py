"""Harnesses that start the real parts (broker, pipeline, API, Slurm) for the tests, the
benchmarks and the docs."""
