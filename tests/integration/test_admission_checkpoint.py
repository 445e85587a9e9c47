"""Admission restarts from a checkpoint: the state with the offsets of the admission log and of
every job-event partition it covers, written only when the state is exactly the fold of the log;
a start loads it, reads only what follows, and answers as a start that replayed everything."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from allmende.core.settings import Settings
from allmende.services.admission_service import CHECKPOINT_KIND
from allmende.testing.budget_harness import ADMIN, SCHEDULER, ok, plan_text, running_api
from allmende.testing.harness import send_events, wait_until
from tests.integration.test_admission import PLAN, TUESDAY_NOON, _ask, _job, _started

pytestmark = pytest.mark.integration
# What every read a decision makes depends on (the heaps' order may differ between a live run and
# a replay; what they yield does not).
VIEW = ("decisions", "holds", "jobs", "unhealthy", "seen", "live", "active_holds", "held_base", "preempted")


def _view(api: Any) -> dict[str, Any]:
    service = api.app.state.admission
    wait_until(service.jobs_caught_up.is_set, 60, "the job events folded")
    with service._lock:
        dump = service.state.dump()
    return {key: dump[key] for key in VIEW}


def _restarted(s: Settings, probe: dict[str, Any]) -> tuple[dict[str, Any], Any, list[Any], dict[str, Any]]:
    with running_api(s, TUESDAY_NOON) as (api, _):
        view = _view(api)
        resumed = api.app.state.admission.resumed_from  # type: ignore[attr-defined]
        answers = [ok(api.get(f"/v1/admission/{j}", headers=SCHEDULER)) for j in ("c1", "c2", "c3", "c4")]
        what_if = _ask(api, probe, dry_run=True)
        return view, resumed, answers, what_if


def test_a_restart_from_the_checkpoint_reads_only_the_tail_and_answers_as_a_full_replay(
    settings: Settings,
) -> None:
    s = settings.model_copy(update={"checkpoint_every_s": 0.2})
    probe = _job("c9", "vision", 16, hours=20)
    with running_api(s, TUESDAY_NOON) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        _ask(api, _job("c1", "vision", 16, hours=10))
        _ask(api, _job("c2", "olmo-ft", 8))
        send_events(s, _started("c1", "vision", 16, TUESDAY_NOON + 5, ("n1", "n2")))
        service = api.app.state.admission  # type: ignore[attr-defined]
        checkpoint = service.checkpoints.path(CHECKPOINT_KIND)

        def covers(decisions: int) -> dict[str, Any] | None:
            if not checkpoint.exists():
                return None
            header = orjson.loads(checkpoint.read_bytes().split(b"\n", 1)[0])
            jobs = header["offsets"][s.job_events_topic]
            return (
                header
                if header["offsets"][s.admission_topic]["0"] >= decisions and sum(jobs.values())
                else None
            )

        first = wait_until(lambda: covers(4), 30, "a checkpoint of two decisions, their holds and c1's start")
        # The tail: more decisions, a host report and job events after the checkpoint.
        ok(api.post("/v1/hosts/health", json={"cluster": "h100-a", "host": "n2", "healthy": False,
                                              "reason": "xid 79"}, headers=SCHEDULER))  # fmt: skip
        service.checkpoints = None  # nothing newer: the next start must read the tail itself
        _ask(api, _job("c3", "olmo-ft", 4))
        _ask(api, _job("c4", "broke", 4))
        send_events(s, _started("c3", "olmo-ft", 4, TUESDAY_NOON + 30, ("n3",)))
        wait_until(lambda: service.state.jobs["c3"].started, 30, "c3's start folded")
        live = _view(api)

    resumed, resumed_from, answers, what_if = _restarted(s, probe)
    offsets = {t: {int(p): o for p, o in ps.items()} for t, ps in first["offsets"].items()}
    assert resumed_from == offsets  # loaded the checkpoint, then read only what follows it
    replayed, nothing, replayed_answers, replayed_what_if = _restarted(
        s.model_copy(update={"checkpoint_every_s": 0}), probe
    )
    assert nothing is None
    assert resumed == replayed == live
    assert answers == replayed_answers and what_if == replayed_what_if
    assert ("h100-a", "n2") in {tuple(h) for h in resumed["unhealthy"]}
