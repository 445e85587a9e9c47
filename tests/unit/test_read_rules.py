"""What each role reads of the tree (services/api/access.py, routes_fairshare.py) and the
sign-in sessions (services/api/auth.py): the rules of docs/security.md, without a server."""

from __future__ import annotations

import pytest

from allmende.domain.fairshare.compute import compute_fairshare
from allmende.domain.fairshare.options import Algorithm
from allmende.domain.fairshare.usage import share_tree
from allmende.schemas.fairshare import FairShareRecord
from allmende.services.api.access import own_nodes, path_nodes, readable_projects
from allmende.services.api.auth import Principal, Sessions
from allmende.services.api.routes_fairshare import FairShareNode, visible_nodes
from allmende.streams.fairshare_calculator import record_of
from tests.unit.admin_builders import node, state_of

# institute > nlp (gina) > {olmo-ft (alice), olmo-eval}; institute > cv > vision (bob); lone (no lead)
STATE = state_of(
    node("institute", kind="organisation", shares=100, leads=["dana"]),
    node("nlp", "institute", kind="group", shares=60, leads=["gina"]),
    node("olmo-ft", "nlp", shares=10, leads=["alice"]),
    node("olmo-eval", "nlp", shares=5),
    node("cv", "institute", kind="group", shares=40),
    node("vision", "cv", shares=40, leads=["bob"]),
    node("lone", None, shares=1),
)
USAGE = {"olmo-ft": 7200.0, "olmo-eval": 100.0, "vision": 36_000.0, "lone": 5.0, "nlp": 50.0, "ghost": 9.0}
ADMIN, SCHEDULER = Principal("root", "admin"), Principal("slurm", "scheduler")
ALICE, BOB, GINA, DANA = (Principal(n, "lead") for n in ("alice", "bob", "gina", "dana"))
USAGE_FIGURES = ("raw_usage", "norm_usage", "effective_usage", "level_fs")


def records(algorithm: Algorithm) -> list[FairShareRecord]:
    tree, leaves = share_tree(STATE.nodes, USAGE)
    result = compute_fairshare(tree, leaves, algorithm)
    return [record_of(row, 1_800_000_000, algorithm.value) for row in result.rows()]


def shown(caller: Principal, algorithm: Algorithm = Algorithm.FAIR_TREE) -> dict[str, FairShareNode]:
    return {n.node_id: n for n in visible_nodes(STATE, caller, records(algorithm))}


def test_a_lead_owns_the_nodes_they_lead_and_everything_below() -> None:
    assert own_nodes(STATE, ALICE) == {"olmo-ft"}
    assert own_nodes(STATE, GINA) == {"nlp", "olmo-ft", "olmo-eval"}
    assert own_nodes(STATE, DANA) == {"institute", "nlp", "olmo-ft", "olmo-eval", "cv", "vision"}
    assert own_nodes(STATE, Principal("nobody", "lead")) == set()
    assert own_nodes(STATE, SCHEDULER) == set() and own_nodes(STATE, ADMIN) == set(STATE.nodes)
    assert path_nodes(STATE, {"olmo-ft"}) == {"nlp", "institute"}
    assert path_nodes(STATE, own_nodes(STATE, GINA)) == {"institute"}
    # The projects they read are the projects among their own nodes.
    for lead in (ALICE, GINA, DANA, BOB):
        assert set(readable_projects(STATE, lead)) == {
            n for n in own_nodes(STATE, lead) if STATE.nodes[n].kind == "project"
        }


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_admins_see_every_node_with_every_figure(algorithm: Algorithm) -> None:
    everything = records(algorithm)
    nodes = visible_nodes(STATE, ADMIN, everything)
    assert [n.node_id for n in nodes] == [r.node_id for r in everything]
    assert all(n.detail == "full" for n in nodes)
    assert [n.model_dump(exclude={"detail"}) for n in nodes] == [r.model_dump() for r in everything]


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_a_lead_sees_their_subtree_with_own_usage_and_factors_and_the_path_with_shares_only(
    algorithm: Algorithm,
) -> None:
    full = {r.node_id: r for r in records(algorithm)}
    gina = shown(GINA, algorithm)
    # Their group, its projects and the usage booked on the group itself; the path to the root.
    assert set(gina) == {"nlp", "olmo-ft", "olmo-eval", "nlp:own", "institute", "root"}
    for node_id in ("nlp", "olmo-ft", "olmo-eval", "nlp:own"):
        mine = gina[node_id]
        assert mine.detail == "own"
        assert (mine.raw_usage, mine.factor) == (full[node_id].raw_usage, full[node_id].factor)
        assert (mine.norm_usage, mine.effective_usage, mine.level_fs) == (None, None, None)
    for node_id in ("institute", "root"):
        above = gina[node_id]
        assert above.detail == "path"
        assert (above.raw_shares, above.norm_shares) == (full[node_id].raw_shares, full[node_id].norm_shares)
        assert all(getattr(above, f) is None for f in (*USAGE_FIGURES, "factor"))
    # Nothing of another branch: no node of it, and no figure that adds it up.
    alice = shown(ALICE, algorithm)
    assert set(alice) == {"olmo-ft", "nlp", "institute", "root"}
    assert alice["olmo-ft"].detail == "own" and alice["nlp"].detail == "path"
    assert set(shown(BOB, algorithm)) == {"vision", "cv", "institute", "root"}
    assert shown(Principal("nobody", "lead"), algorithm) == {}


def test_what_a_lead_sees_keeps_the_tree_s_depth_first_order() -> None:
    order = [r.node_id for r in records(Algorithm.FAIR_TREE)]
    seen = [n.node_id for n in visible_nodes(STATE, GINA, records(Algorithm.FAIR_TREE))]
    assert seen == [n for n in order if n in set(seen)]


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_the_scheduler_sees_every_project_s_factor_and_no_usage(algorithm: Algorithm) -> None:
    full = {r.node_id: r for r in records(algorithm)}
    sched = shown(SCHEDULER, algorithm)
    assert set(sched) == {n for n, r in full.items() if r.is_leaf}
    assert {"olmo-ft", "olmo-eval", "vision", "lone", "ghost"} <= set(sched)
    for node_id, seen in sched.items():
        assert seen.detail == "factor" and seen.factor == full[node_id].factor
        assert all(getattr(seen, f) is None for f in USAGE_FIGURES)


def test_the_agent_reads_its_factors_from_what_the_scheduler_sees() -> None:
    """integrations/slurm/agent.py keeps the leaves' node_id and factor: all there."""
    body = [n.model_dump(mode="json") for n in visible_nodes(STATE, SCHEDULER, records(Algorithm.FAIR_TREE))]
    factors = {str(n["node_id"]): float(n["factor"]) for n in body if n.get("is_leaf")}
    assert factors == {r.node_id: r.factor for r in records(Algorithm.FAIR_TREE) if r.is_leaf}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_is_an_opaque_id_that_names_who_signed_in_until_it_expires() -> None:
    clock = Clock()
    sessions = Sessions(ttl_s=3600, max_sessions=10, clock=clock)
    first, second = sessions.open(ALICE), sessions.open(ALICE)
    assert first != second and len(first) >= 40  # 256 random bits, base64url
    assert "alice" not in first
    assert sessions.who(first) == ALICE and sessions.who(second) == ALICE
    assert sessions.who("not-a-session") is None and sessions.who("") is None
    clock.now += 3599
    assert sessions.who(first) == ALICE
    clock.now += 1
    assert sessions.who(first) is None and len(sessions) == 1  # expired, and forgotten


def test_signing_out_ends_the_session_and_only_that_one() -> None:
    sessions = Sessions(ttl_s=3600, max_sessions=10, clock=Clock())
    mine, other = sessions.open(ALICE), sessions.open(ADMIN)
    assert sessions.close(mine) == (True, None)
    assert sessions.who(mine) is None and sessions.who(other) == ADMIN
    assert sessions.close(mine) == (False, None)


def test_sessions_are_bounded_expired_ones_first_then_the_oldest() -> None:
    clock = Clock()
    sessions = Sessions(ttl_s=100, max_sessions=3, clock=clock)
    stale = sessions.open(ALICE)
    clock.now += 60
    kept = [sessions.open(BOB), sessions.open(GINA)]
    clock.now += 50  # `stale` has expired, the others not
    newest = sessions.open(DANA)
    assert len(sessions) == 3 and sessions.who(stale) is None
    assert [sessions.who(s) for s in (*kept, newest)] == [BOB, GINA, DANA]
    pushed = sessions.open(ADMIN)  # none expired: the oldest goes
    assert len(sessions) == 3 and sessions.who(kept[0]) is None
    assert [sessions.who(s) for s in (kept[1], newest, pushed)] == [GINA, DANA, ADMIN]


def test_the_session_store_keeps_no_id_in_the_clear() -> None:
    sessions = Sessions(ttl_s=100, max_sessions=3, clock=Clock())
    session_id = sessions.open(ALICE)
    assert session_id not in repr(vars(sessions))
