"""Where state goes (ALLMENDE_STATE_DIR and what derives from it) and which roles an API process runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from allmende.cli.main import app
from allmende.core.settings import Settings
from allmende.topology import API_ROLES, with_roles

STATE_KEYS = ("ALLMENDE_STATE_DIR", "XDG_STATE_HOME", "ALLMENDE_CLICKHOUSE_DSN", "ALLMENDE_RUN_DIR")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for key in STATE_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_state_goes_under_the_working_directory_by_default(clean_env: Path) -> None:
    s = Settings()
    assert s.state_dir == clean_env / ".allmende"
    assert s.clickhouse_dsn == f"chdb://{clean_env / '.allmende' / 'chdb'}"
    assert (s.meter_data_dir, s.run_dir, s.kafka_home) == tuple(
        clean_env / ".allmende" / name for name in ("faust", "run", "kafka")
    )


def test_the_xdg_state_directory_is_the_default_where_it_is_set(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(clean_env / "xdg"))
    assert Settings().run_dir == clean_env / "xdg" / "allmende" / "run"


def test_one_setting_moves_every_piece_of_state_and_each_may_be_set_apart(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALLMENDE_STATE_DIR", str(clean_env / "state"))
    monkeypatch.setenv("ALLMENDE_CLICKHOUSE_DSN", "http://ch:8123")
    s = Settings()
    assert s.clickhouse_dsn == "http://ch:8123"
    assert s.meter_data_dir == clean_env / "state" / "faust"
    assert Settings(run_dir=clean_env / "elsewhere").run_dir == clean_env / "elsewhere"


def test_roles_switch_exactly_the_named_components_on() -> None:
    s = with_roles(Settings(), {"writer", "alerts"})
    assert (s.writer_enabled, s.fairshare_enabled, s.admission_enabled, s.alerts_enabled) == (
        True, False, False, True,
    )  # fmt: skip
    everything = with_roles(Settings(writer_enabled=False), set(API_ROLES))
    assert all(getattr(everything, flag) for flag in API_ROLES.values())


def test_reads_alone_runs_http_without_any_component() -> None:
    s = with_roles(Settings(), {"reads"})
    assert not any(getattr(s, flag) for flag in API_ROLES.values())
    assert with_roles(Settings(), {"reads", "fairshare"}).fairshare_enabled


def test_an_unknown_role_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: writer, fairshare, admission, alerts"):
        with_roles(Settings(), {"writer", "ledger"})
    result = CliRunner().invoke(app, ["serve", "--role", "ledger"])
    assert result.exit_code == 2 and "unknown roles ['ledger']" in result.output
