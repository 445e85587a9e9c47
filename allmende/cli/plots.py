"""Charts people would rather look at than read."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def usage_chart(usage: dict[str, Any], out: Path) -> None:
    """Stacked bars of GPU-hours per day (stacked by `group` when the usage was grouped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = sorted({d["day"] for d in usage["days"]})
    groups = sorted({d["group"] or "" for d in usage["days"]})
    fig, ax = plt.subplots(figsize=(max(6, len(days) * 0.25), 4))
    bottom = [0.0] * len(days)
    index = {day: i for i, day in enumerate(days)}
    for group in groups:
        heights = [0.0] * len(days)
        for d in usage["days"]:
            if (d["group"] or "") == group:
                heights[index[d["day"]]] = float(d["gpu_hours"])
        ax.bar(days, heights, bottom=bottom, label=group or None)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_title(f"{usage['project']}: GPU-hours per day (total {float(usage['total_gpu_hours']):,.0f})")
    ax.set_ylabel("GPU-hours")
    ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    if len(groups) > 1:
        ax.legend(title=usage.get("group_by"), fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def balance_chart(balance: dict[str, Any], out: Path) -> None:
    """Per allocation: allocated beside charged (and held), weighted GPU-hours; overspend in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = balance["allocations"]
    labels = [f"{line['allocation_id']}\n{line['scope']}" for line in lines] + ["over budget"]
    allocated = [float(line["allocated_gpu_hours"]) for line in lines] + [0.0]
    charged = [float(line["charged_gpu_hours"]) for line in lines] + [float(balance["over_budget_gpu_hours"])]
    held = [float(line["held_gpu_hours"]) for line in lines] + [0.0]
    xs = range(len(labels))
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 1.6), 4.5))
    ax.bar([x - 0.2 for x in xs], allocated, width=0.4, label="allocated", color="#9ecae1")
    colors = ["#d62728" if c + h > a else "#3182bd" for a, c, h in zip(allocated, charged, held, strict=True)]
    ax.bar([x + 0.2 for x in xs], charged, width=0.4, label="charged", color=colors)
    ax.bar([x + 0.2 for x in xs], held, width=0.4, bottom=charged, label="held", color="#fdae6b")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("weighted GPU-hours")
    ax.set_title(f"{balance['project']}: allocated vs charged")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
