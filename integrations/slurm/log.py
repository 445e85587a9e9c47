"""The integration's own log: timestamped lines appended to a file (the hook's, the agent's),
and to stderr when asked or when the file cannot be written: the hooks and the agent never fail
for want of a log."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


class LineLog:
    def __init__(self, path: Path | None, echo: bool = False, with_pid: bool = False) -> None:
        self.path = path
        self.echo = echo  # every line to stderr too
        self.with_pid = with_pid  # hook runs overlap: tell them apart

    def __call__(self, message: str) -> None:
        pid = f" pid={os.getpid()}" if self.with_pid else ""
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}{pid} {message}\n"
        if self.echo:
            sys.stderr.write(line)
            sys.stderr.flush()
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:
                    f.write(line)
                return
            except OSError:
                pass
        if not self.echo:
            sys.stderr.write(line)
