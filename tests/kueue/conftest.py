"""A real etcd, kube-apiserver and Kueue on 127.0.0.1 for the Kueue tests: one per session
(allmende.testing.kubernetes; the binaries are built by `make kubernetes`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from allmende.testing.kubernetes import BIN, KubeCluster, missing_binaries, running_kubernetes


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    if missing := missing_binaries():
        names = ", ".join(str(path.relative_to(BIN)) for path in missing)
        pytest.fail(f"not in {BIN}: {names}: run `make kubernetes` first", pytrace=False)
    with running_kubernetes(tmp_path_factory.mktemp("kubernetes")) as cluster:
        phases = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in cluster.phase_seconds.items())
        memory = sum(cluster.rss_mb().values())
        # shown with -s
        print(f"\nKubernetes with Kueue ready in {cluster.startup_seconds:.1f}s ({phases}), {memory:.0f} MB")
        yield cluster
