"""Integrations of real schedulers with the platform (integrations/slurm)."""
