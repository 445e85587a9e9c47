"""GPUs in use per cluster: peaks, over-capacity episodes, the runs that pushed a cluster over."""

from __future__ import annotations

from allmende.domain.burn_alerts import fold
from allmende.domain.capacity import (
    Episode,
    InUse,
    RunOnCluster,
    accounted_for,
    capacity_alerts,
    episodes,
    peak_in_use,
    pushed_over,
    usage_disputes,
)


def test_peak_in_use_hands_gpus_over_at_an_instant() -> None:
    assert peak_in_use([]) == 0
    assert peak_in_use([(0, 10, 4), (10, 20, 4)]) == 4  # one ends as the next starts
    assert peak_in_use([(0, 10, 4), (9, 20, 4)]) == 8
    assert peak_in_use([(0, 10, 4), (5, 5, 100), (3, 8, 0)]) == 4  # empty runs take nothing


def test_touching_stretches_are_one_episode_and_a_gap_or_another_cluster_starts_a_new_one() -> None:
    rows = [
        InUse("a", 10, 20, 18), InUse("a", 20, 30, 24), InUse("a", 40, 50, 17),
        InUse("b", 50, 60, 9),
    ]  # fmt: skip
    assert episodes(rows, {"a": 16, "b": 8}) == [
        Episode("a", 16, 10, 30, 24), Episode("a", 16, 40, 50, 17), Episode("b", 8, 50, 60, 9),
    ]  # fmt: skip


def test_the_last_runs_to_start_are_taken_until_they_cover_the_excess() -> None:
    episode = Episode("a", 16, 10, 30, 26)  # 10 over
    runs = [
        RunOnCluster("early", "p", 0, 12), RunOnCluster("mid", "q", 5, 8),
        RunOnCluster("late-x", "r", 9, 4), RunOnCluster("late-y", "r", 9, 2),
    ]  # fmt: skip
    assert [r.job_id for r in pushed_over(episode, runs)] == ["late-y", "late-x", "mid"]
    assert [r.job_id for r in pushed_over(Episode("a", 16, 10, 30, 18), runs)] == ["late-y"]


def test_an_episode_is_alerted_once() -> None:
    t = 1_800_000_000
    episode = Episode("a", 16, t + 10, t + 30, 24)
    found = [(episode, [RunOnCluster("first", "p", t, 12), RunOnCluster("second", "q", t + 10, 12)])]
    [alert] = capacity_alerts(found, set(), now=t + 100)
    assert (alert.cluster, alert.jobs, alert.projects, alert.peak_gpus) == ("a", ["second"], ["q"], 24)
    state = fold([alert, alert])
    assert state.capacity == {("a", t + 10)}
    assert capacity_alerts(found, state.capacity, now=t + 200) == []
    longer = [(Episode("a", 16, t + 10, t + 45, 24), found[0][1])]  # the same episode, seen further
    assert capacity_alerts(longer, state.capacity, now=t + 300) == []


def test_only_runs_with_a_project_not_disputed_before_are_disputed() -> None:
    t = 1_800_000_000
    episode = Episode("a", 16, t + 10, t + 30, 30)  # 14 over
    runs = [
        RunOnCluster("old", "p", t, 12), RunOnCluster("mid", "q", t + 5, 8),
        RunOnCluster("orphan", "", t + 8, 4), RunOnCluster("late", "r", t + 9, 6),
    ]  # fmt: skip
    events = usage_disputes([(episode, runs)], disputed={"mid"}, now=t + 60)
    # pushed over: late, orphan, mid (6 + 4 + 8 >= 14); orphan has no project, mid is disputed
    assert [(e.job_id, e.project, e.cluster, e.event_id) for e in events] == [
        ("late", "r", "a", "dispute:late:raised")
    ]
    assert usage_disputes([(episode, runs), (episode, runs)], disputed=set(), now=t + 60) == usage_disputes(
        [(episode, runs)], disputed=set(), now=t + 60
    )  # a run in two episodes is disputed once


def test_an_episode_the_look_back_cut_is_not_raised_again() -> None:
    t = 1_800_000_000
    runs = [RunOnCluster("first", "p", t, 12), RunOnCluster("second", "q", t + 10, 12)]
    [alert] = capacity_alerts([(Episode("a", 16, t + 10, t + 30, 24), runs)], set(), now=t + 100)
    # Days later the look-back starts inside it: the same episode, cut at a later change point.
    cut = Episode("a", 16, t + 20, t + 30, 24, clipped=True)
    assert capacity_alerts([(cut, runs)], {(alert.cluster, alert.start)}, now=t + 9 * 86_400) == []
    # A cluster never alerted before is alerted even when cut: nobody has heard of it yet.
    [first] = capacity_alerts([(Episode("b", 16, t + 20, t + 30, 24, clipped=True), runs)], set(), now=t)
    assert first.cluster == "b"


def test_runs_that_no_longer_hold_the_peak_leave_the_episode_for_a_later_round() -> None:
    t = 1_800_000_000
    episode = Episode("a", 16, t + 10, t + 30, 24)
    both = [RunOnCluster("first", "p", t, 12), RunOnCluster("second", "q", t + 10, 12)]
    assert accounted_for(episode, both)
    # Read after the writer withheld "second": taking "first" for the pusher would be wrong.
    assert not accounted_for(episode, both[:1])
