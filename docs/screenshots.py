"""Screenshots of the dashboard pages on a replayed trace: docs/screenshot-overview.png and
docs/screenshot-project.png (`make screenshots`), full-page captures 1366 px wide.

Where the pages come from:
- ALLMENDE_API_URL (or --api) answers /healthz, e.g. a running `make demo`: that API, signed in
  with --token, else ALLMENDE_TOKEN, else the local admin token `allmende up` made;
- otherwise the browser tests' platform (tests/browser/platform_harness.py) is started here: the API on a
  free port with embedded chDB in a temporary directory, a meter worker, the small 2021-Q2 plan
  and a slice of the ElasticFlow trace replayed, on the broker KAFKA_BOOTSTRAP_SERVERS names or,
  without it, a local broker from the project's jars (`make jars`). About half a minute.

Chromium is the system's (/usr/bin/chromium), driven headless by Playwright.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
VIEWPORT = {"width": 1366, "height": 768}


def say(text: str) -> None:
    sys.stderr.write(f"{text}\n")


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=3).status_code in (200, 503)
    except httpx.HTTPError:
        return False


@contextmanager
def _own_platform() -> Iterator[tuple[str, str, str]]:
    """(url, admin token, project) of a platform started here for the screenshots."""
    from allmende.core.kafka_local import broker_for_run
    from allmende.testing.platform_harness import ADMIN_TOKEN, running_platform

    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="allmende-screenshots-"))
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        bootstrap = stack.enter_context(broker_for_run(work / "kafka", say))
        say("starting the API and a meter worker, replaying the trace slice")
        started = time.monotonic()
        platform = stack.enter_context(running_platform(bootstrap, f"chdb://{work / 'chdb'}", work))
        say(f"ledger exact after {time.monotonic() - started:.0f} s")
        yield platform.url, ADMIN_TOKEN, "ef-cluster10"


def _busiest_project(url: str, token: str) -> str:
    r = httpx.get(f"{url}/v1/dashboard/overview", headers={"Authorization": f"Bearer {token}"}, timeout=60)
    r.raise_for_status()
    rows = r.json()["rows"]
    if not rows:
        raise SystemExit("the API shows no project to screenshot")
    return str(max(rows, key=lambda row: float(row["charged_gpu_hours"]))["project"])


def _capture(page: Page, url: str, out: Path) -> None:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    response = page.goto(url)
    if response is None or response.status != 200:
        raise SystemExit(f"{url}: HTTP {response.status if response else '?'}")
    page.wait_for_function("document.body.dataset.ready === 'true'", timeout=60_000)
    page.screenshot(path=str(out), full_page=True)
    say(
        f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}"
        + (f" (errors: {errors})" if errors else "")
    )


def shoot(url: str, token: str, project: str, out_dir: Path) -> None:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)  # type: ignore[arg-type]
            page = context.new_page()
            page.goto(f"{url}/ui/signin")
            page.fill("#token", token)
            with page.expect_navigation():
                page.click("button[type=submit]")
            if "/ui/signin" in page.url:
                raise SystemExit("the token was refused at sign-in")
            _capture(page, f"{url}/ui/overview", out_dir / "screenshot-overview.png")
            _capture(page, f"{url}/ui/projects/{project}", out_dir / "screenshot-project.png")
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--api", default=os.environ.get("ALLMENDE_API_URL"), help="a running API to use")
    parser.add_argument("--token", help="an admin token for --api (default: ALLMENDE_TOKEN, the local one)")
    parser.add_argument("--project", help="the project page to capture (default: the one that charged most)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the PNGs go (default: docs/)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.api and _answers(args.api.rstrip("/")):
        from allmende.cli.api_client import token_for
        from allmende.core.settings import Settings

        url = args.api.rstrip("/")
        token = args.token or token_for(Settings())
        if not token:
            raise SystemExit(f"no token for {url}: pass --token or set ALLMENDE_TOKEN")
        say(f"using the API at {url}")
        shoot(url, token, args.project or _busiest_project(url, token), args.out)
        return
    with _own_platform() as (url, token, project):
        shoot(url, token, args.project or project, args.out)


if __name__ == "__main__":
    main()
