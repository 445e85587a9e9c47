"""Contract tests of the dcgm-exporter scrape parser on two real recorded scrapes
(../shared/data/dcgm: an L4 with host labels only, a T4 with Kubernetes pod labels), as they are
and with `hpc_job` labels added the way the exporter adds them on a Slurm node (each series of a
mapped GPU once per job on it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from allmende.integrations.dcgm.scrape import UTILIZATION, ScrapeError, parse_scrape
from allmende.integrations.dcgm.stand_in import exporter_text as with_jobs

DCGM = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "dcgm"
L4 = DCGM / "l4-gpu-operator.prom"
T4 = DCGM / "t4-kubernetes-pod.prom"

pytestmark = pytest.mark.skipif(not L4.exists(), reason="the recorded scrapes are not here")


def test_the_l4_scrape_as_recorded_is_one_idle_unmapped_gpu() -> None:
    scrape = parse_scrape(L4.read_text(), "l4-node")
    (gpu,) = scrape.gpus
    assert (gpu.gpu, gpu.uuid, gpu.jobs) == (0, "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c", ())
    assert (gpu.utilization_pct, gpu.power_mw) == (0, 16_365)
    assert not gpu.unaccounted and scrape.jobs() == {} and scrape.problems == ()


def test_the_t4_scrape_maps_its_gpu_to_the_pod_using_it() -> None:
    scrape = parse_scrape(T4.read_text(), "k3s-node")
    (gpu,) = scrape.gpus
    assert gpu.jobs == ("default/gpu-test",)
    assert (gpu.utilization_pct, gpu.fb_used_mib, gpu.power_mw) == (0, 0, 15_507)
    assert list(scrape.jobs()) == ["default/gpu-test"]


def test_hpc_job_labels_map_each_gpu_to_its_jobs_with_its_own_values() -> None:
    jobs: dict[int, list[str]] = {0: ["4101", "4102"], 1: ["4200"], 2: []}
    text = with_jobs(L4.read_text(), jobs, utilization={0: 0, 1: 87, 2: 55})
    scrape = parse_scrape(text, "l4-node")
    by_gpu = {g.gpu: g for g in scrape.gpus}
    assert by_gpu[0].jobs == ("4101", "4102") and by_gpu[0].utilization_pct == 0
    assert by_gpu[1].jobs == ("4200",) and by_gpu[1].utilization_pct == 87
    assert by_gpu[2].jobs == () and by_gpu[2].unaccounted  # busy, no job on it
    assert {job: [g.gpu for g in gpus] for job, gpus in scrape.jobs().items()} == {
        "4101": [0], "4102": [0], "4200": [1]
    }  # fmt: skip
    assert all(g.power_mw == 16_365 for g in scrape.gpus)


def test_a_series_without_a_gpu_index_is_skipped_and_said() -> None:
    lines = L4.read_text().splitlines()
    broken = [line.replace('gpu="0",', "") if line.startswith(UTILIZATION) else line for line in lines]
    scrape = parse_scrape("\n".join(broken) + "\n", "l4-node")
    (gpu,) = scrape.gpus  # the GPU's other series still read
    assert gpu.utilization_pct is None and gpu.power_mw == 16_365
    assert len(scrape.problems) == 1 and UTILIZATION in scrape.problems[0]


@pytest.mark.parametrize(
    "damage",
    [
        lambda t: t.replace(f"{UTILIZATION}{{", f"{UTILIZATION}{{gpu=", 1),  # a broken label set
        lambda t: t + 'DCGM_FI_DEV_GPU_UTIL{gpu="0"} zero\n',  # a value that is no number
    ],
)
def test_a_malformed_scrape_is_an_error_never_an_idle_node(damage: object) -> None:
    with pytest.raises(ScrapeError, match="l4-node"):
        parse_scrape(damage(L4.read_text()), "l4-node")  # type: ignore[operator]
