"""The node's prolog and epilog keep dcgm-exporter's job mapping (issue 24, part 2): on a real
Slurm with fake GPUs, a GPU job's prolog writes one file per GPU it holds (named by the GPU's
index, holding the id the platform knows the job by: its admission id, from the admin comment
job_submit.lua wrote), a second job on other GPUs gets files of its own, and each job's epilog
takes its id out again; the exporter (`--hpc-job-mapping-dir`) then labels each GPU's metrics with
the job on it, and the job's samples meet its lifecycle events in the meter."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from allmende.testing.slurm_harness import SLURM_CLUSTER, Platform, SlurmCluster, wait_for

pytestmark = pytest.mark.slurm


def _job_id(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"sbatch failed: {result.stderr}"
    return result.stdout.strip().split(";")[0]


def _mapping(directory: Path) -> dict[str, list[str]]:
    """GPU index -> the job ids in its file."""
    if not directory.exists():
        return {}
    return {f.name: f.read_text().split() for f in sorted(directory.iterdir()) if f.name.isdigit()}


@pytest.fixture
def configured(slurm: SlurmCluster, platform: Platform) -> Iterator[SlurmCluster]:
    slurm.cancel_all()
    slurm.configure(**platform.config())
    yield slurm
    slurm.configure(**platform.config())


def test_the_prolog_maps_a_jobs_gpus_and_the_epilog_unmaps_them(configured: SlurmCluster) -> None:
    mapping = configured.dcgm_mapping_dir
    first = _job_id(configured.sbatch("-A", "rich", "--gres=gpu:h100:2", "-t", "5", "--wrap", "sleep 20"))
    second = _job_id(configured.sbatch("-A", "rich", "--gres=gpu:h100:3", "-t", "5", "--wrap", "sleep 6"))
    both = wait_for(lambda: _when(mapping, lambda m: sum(map(len, m.values())) == 5), 90, "both jobs mapped")
    by_job: dict[str, set[str]] = {}
    for gpu, jobs in both.items():
        assert len(jobs) == 1, both  # whole GPUs: one job each
        by_job.setdefault(jobs[0], set()).add(gpu)
    label = {job: _platform_id(configured, job) for job in (first, second)}
    assert sorted(len(g) for g in by_job.values()) == [2, 3] and set(by_job) == set(label.values())
    # The GPUs Slurm gave each job (scontrol's GRES index list) are the files that name it.
    for job in (first, second):
        detail = configured.run("scontrol", "-d", "show", "job", job).stdout
        assert f"IDX:{_idx(by_job[label[job]])}" in detail, detail

    configured.wait_done(second)
    left = wait_for(
        lambda: _when(mapping, lambda m: all(label[second] not in jobs for jobs in m.values())),
        60,
        "its epilog",
    )
    assert {gpu for gpu, jobs in left.items() if jobs == [label[first]]} == by_job[label[first]]
    configured.run("scancel", first)
    configured.wait_done(first)
    wait_for(lambda: _mapping(mapping) == {} or None, 60, "the first job's epilog")


def _platform_id(slurm: SlurmCluster, job: str) -> str:
    """The job's admission id (admin comment `allmende:<id>`, as integrations/slurm/lifecycle.py
    reads it), else slurm-<ClusterName>-<job id>."""
    shown = slurm.run("scontrol", "show", "job", "-o", job).stdout
    tag = shown.split("AdminComment=", 1)[1].split()[0] if "AdminComment=" in shown else ""
    return tag.removeprefix("allmende:") if tag.startswith("allmende:") else f"slurm-{SLURM_CLUSTER}-{job}"


def _when(directory: Path, holds: Callable[[dict[str, list[str]]], bool]) -> dict[str, list[str]] | None:
    mapping = _mapping(directory)
    return mapping if holds(mapping) else None


def _idx(gpus: set[str]) -> str:
    """Slurm's way of writing a set of GPU indices: 0-1,4."""
    numbers = sorted(int(g) for g in gpus)
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
