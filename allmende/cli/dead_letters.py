"""`allmende dead-letters ...`: what was refused and why; re-drive what a plan fix has mended.

Reads and writes Kafka directly (like `allmende replay`): run it where the broker is reachable.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from allmende.cli.api_client import console
from allmende.core.dead_letters import mended_by_plan, read_letters, redrivable, redrive, select
from allmende.core.settings import Settings

dead_letters_app = typer.Typer(
    help="Refused records (the dead-letter topic): list them by reason, re-drive a selection.",
    no_args_is_help=True,
)

Codes = Annotated[list[str], typer.Option("--code", help="only letters of this code (repeatable)")]
Stages = Annotated[
    list[str], typer.Option("--stage", help="only letters of this stage: meter, ledger-writer, ...")
]
Offsets = Annotated[list[int], typer.Option("--offset", help="only the letter at this offset (repeatable)")]


def _utc(instant: int) -> str:
    return dt.datetime.fromtimestamp(instant, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


@dead_letters_app.command("list")
def list_letters(
    code: Codes = [],  # noqa: B006 (typer's repeatable option)
    stage: Stages = [],  # noqa: B006
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per letter")] = False,
    limit: Annotated[int, typer.Option(help="show at most the last N letters", min=1)] = 50,
) -> None:
    """Refused records, counted by code, and the latest of them with their reasons."""
    s = Settings()
    letters = select(read_letters(s), code, stage)
    if as_json:
        for item in letters:
            print(
                json.dumps(
                    {"offset": item.offset, **item.letter.model_dump(exclude={"value_b64", "key_b64"})}
                )
            )
        return
    counts = Counter((item.letter.stage, item.letter.code or "-") for item in letters)
    summary = Table(title=f"{len(letters)} dead letters on {s.dead_letter_topic}")
    for column in ("stage", "code", "letters", "fix"):
        summary.add_column(column)
    for (where, kind), n in sorted(counts.items()):
        fix = "declare it in the plan, then re-drive" if mended_by_plan(where, kind) else "the producer's"
        summary.add_row(where, kind, f"{n:,}", fix)
    console.print(summary)
    table = Table(title=f"the latest {min(limit, len(letters))}")
    for column in ("offset", "refused (UTC)", "stage", "code", "record", "reason"):
        table.add_column(column, overflow="fold")
    for item in letters[-limit:]:
        letter = item.letter
        place = f"{letter.source_topic}/{letter.source_partition}@{letter.source_offset}"
        table.add_row(
            str(item.offset), _utc(letter.refused_at), letter.stage, letter.code, place, letter.reason
        )
    console.print(table)


@dead_letters_app.command("redrive")
def redrive_letters(
    code: Codes = [],  # noqa: B006
    offset: Offsets = [],  # noqa: B006
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be sent; send nothing")] = False,
) -> None:
    """Send the meter's refused job events of the selection to the job-events topic again.

    Do it once the plan declares what they lacked: they are checked again, and metered exactly
    as if they had come on time; the ones still refused get new letters. Safe to repeat.
    """
    if not code and not offset:
        raise typer.BadParameter("choose what to re-drive: --code (e.g. unknown-cluster) or --offset")
    s = Settings()
    chosen = [item for item in select(read_letters(s), code, offsets=offset) if redrivable(item.letter, s)]
    if dry_run or not chosen:
        console.print(
            f"{len(chosen)} refused job events would be re-driven" if dry_run else "nothing to re-drive"
        )
        return
    with Progress(TextColumn("[bold]re-drive"), BarColumn(), MofNCompleteColumn(), console=console) as bar:
        task = bar.add_task("re-drive", total=len(chosen))
        done = redrive(s, chosen, on_each=lambda: bar.advance(task))
    console.print(f"{done.sent} job events sent again to {s.job_events_topic}")
    for at, why in done.skipped:
        console.print(f"[yellow]letter {at} not re-driven[/yellow]: {why}")
    if done.skipped:
        raise typer.Exit(1)
