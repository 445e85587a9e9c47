"""The meter worker's event loop (ALLMENDE_METER_LOOP) and the settings it shares with the bench.

The loop is chosen once per process, before faust is imported, so each case runs in a fresh
interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_worker_imports_no_faust() -> None:
    # faust reads F_LOOP when it is imported: the worker must get to choose first.
    code = (
        "import sys, allmende.streams.meter_worker\n"
        "print([m for m in sys.modules if m.split('.')[0] in {'faust', 'mode'}])\n"
    )
    assert _python(code) == "[]"


@pytest.mark.parametrize(("loop", "policy"), [("uvloop", "uvloop"), ("aio", "asyncio.unix_events")])
def test_the_setting_picks_the_loop_faust_runs_on(loop: str, policy: str) -> None:
    code = (
        "from allmende.core.settings import Settings\n"
        "from allmende.streams.meter_worker import loop_policy, select_loop\n"
        "select_loop(Settings().meter_loop)\n"
        "import faust, os\n"
        "print(loop_policy(), os.environ['F_LOOP'])\n"
    )
    # A stray F_LOOP of the caller's does not win over the setting.
    stray = "aio" if loop == "uvloop" else "uvloop"
    assert _python(code, ALLMENDE_METER_LOOP=loop, F_LOOP=stray) == f"{policy} {loop}"


def test_uvloop_is_the_default() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ALLMENDE_METER_LOOP"}
    done = subprocess.run(
        [sys.executable, "-c", "from allmende.core.settings import Settings; print(Settings().meter_loop)"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "uvloop", done.stderr


def test_a_loop_chosen_after_faust_was_imported_still_applies() -> None:
    code = (
        "import faust\n"
        "from allmende.streams.meter_worker import loop_policy, select_loop\n"
        "select_loop('uvloop'); a = loop_policy()\n"
        "select_loop('aio'); print(a, loop_policy())\n"
    )
    assert _python(code, F_LOOP="aio") == "uvloop asyncio.unix_events"


def test_the_counting_agent_of_the_bench_reads_like_the_meter(tmp_path: Path) -> None:
    # bench/faust_ceiling.py builds its app from stream_settings(): the meter must too.
    code = (
        "from allmende.core.settings import Settings\n"
        "from allmende.streams.meter import BATCH_MAX, create_app, stream_settings\n"
        f"app = create_app(Settings(meter_data_dir={str(tmp_path)!r}))\n"
        "c = app.conf\n"
        "s = stream_settings()\n"
        "print(c.stream_buffer_maxsize == s['stream_buffer_maxsize'] >= BATCH_MAX,"
        " c.broker_commit_every == s['broker_commit_every'])\n"
    )
    assert _python(code) == "True True"
