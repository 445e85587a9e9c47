"""Where things live: the state directory, and the source checkout when the package runs from one.

State (embedded ClickHouse, faust tables, pid files, a local broker) never goes beside the code:
installed, that would be site-packages. `ALLMENDE_STATE_DIR` names it; otherwise it is
`$XDG_STATE_HOME/allmende` when that is set, else `.allmende` under the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_state_dir() -> Path:
    xdg = os.environ.get("XDG_STATE_HOME")
    return Path(xdg) / "allmende" if xdg else Path.cwd() / ".allmende"


def source_checkout() -> Path | None:
    """The repository this package runs from (an editable install), or None for an installed wheel.

    Only development tools use it: the Kafka jars' pom (infra/kafka), the local Slurm (infra/slurm),
    the demo's plan and trace. Resolved, allmende/core/ sits two levels under the checkout.
    """
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "infra").is_dir() else None
