"""NVIDIA dcgm-exporter: GPU utilisation per job, from the exporters a GPU site already runs."""
