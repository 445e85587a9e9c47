"""Allmende's Slurm integration: the job_submit/lua plugin's Python companions (README.md)."""
