"""Fair-share benchmark: what the fair-share calculator computes at each snapshot.

Builds a tree of `--depth` levels below the root with `--leaves` leaves (accounts fan out evenly,
leaves are dealt round-robin to the deepest accounts), random raw shares and usage from a fixed
seed, then times with time.perf_counter_ns:

  full      compute_fairshare over the whole tree, classic and Fair Tree (target: 50 ms)
  snapshot  what the calculator runs per snapshot (`FairShareCalculator.compute`): decay every
            project-hour of a quarter (`decayed_usage`, 150 projects), build the tree
            (`share_tree`) and compute Fair Tree (`compute_fairshare`); beside it, the last
            step alone

    .venv/bin/python bench/fairshare.py [--leaves 10000] [--depth 5] [--repeat 200] [--seed 7]
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import statistics
import time
from collections.abc import Callable

from allmende.domain.fairshare.compute import compute_fairshare
from allmende.domain.fairshare.decay import DEFAULT_HALF_LIFE
from allmende.domain.fairshare.options import Algorithm
from allmende.domain.fairshare.tree import PARENT, ShareNode, Shares, ShareTree
from allmende.domain.fairshare.usage import decayed_usage, share_tree
from allmende.domain.organisation import Node

FULL_TARGET_MS = 50.0
HOUR = 3600


def build_tree(leaves: int, depth: int, rng: random.Random) -> tuple[ShareTree, list[str]]:
    """Accounts on levels 1..depth-1, each fanning out `fanout` ways; leaves on level `depth`."""
    fanout = max(1, round(leaves ** (1 / depth)))
    nodes: list[ShareNode] = []
    level = ["root"]
    for d in range(1, depth):
        below = [f"a{d}-{k}" for k in range(len(level) * fanout)]
        nodes += [ShareNode(name, level[k // fanout], rng.randint(1, 100)) for k, name in enumerate(below)]
        level = below
    names = [f"u{k}" for k in range(leaves)]
    # Mostly positive shares, 1% with 0 (no effective share) and 1% with "parent".
    for k, name in enumerate(names):
        roll = rng.random()
        shares: Shares = 0 if roll < 0.01 else PARENT if roll < 0.02 else rng.randint(1, 10)
        nodes.append(ShareNode(name, level[k % len(level)], shares))
    return ShareTree(nodes), names


def percentile(samples_ns: list[int], fraction: float) -> float:
    ordered = sorted(samples_ns)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)] / 1e6


def timed(repeat: int, action: Callable[[], object]) -> tuple[float, float]:
    """Median and p99 in milliseconds over `repeat` runs (after one warm-up run)."""
    action()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        action()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e6, percentile(samples, 0.99)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--leaves", type=int, default=10_000, help="number of leaves (default 10000)")
    parser.add_argument("--depth", type=int, default=5, help="levels below the root (default 5)")
    parser.add_argument("--repeat", type=int, default=200, help="timed repetitions per figure (default 200)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    args = parser.parse_args()
    if args.leaves < 1 or args.depth < 1 or args.repeat < 1:
        parser.error("--leaves, --depth and --repeat must be at least 1")

    rng = random.Random(args.seed)
    tree, leaves = build_tree(args.leaves, args.depth, rng)
    usage = {leaf: rng.choice([0.0, rng.uniform(0, 5e6)]) for leaf in leaves}
    print(
        f"tree: {len(tree)} nodes, {len(leaves)} leaves, depth {args.depth}, "
        f"{sum(1 for v in usage.values() if v)} leaves with usage; repeat {args.repeat}, seed {args.seed}"
    )

    rows: list[tuple[str, float, float, float]] = []
    for algorithm in Algorithm:
        median, p99 = timed(args.repeat, functools.partial(compute_fairshare, tree, usage, algorithm))
        rows.append((f"full recompute, {algorithm}", median, p99, FULL_TARGET_MS))

    width = max(len(name) for name, *_ in rows)
    print(f"{'figure':<{width}}  {'median ms':>10}  {'p99 ms':>10}  {'target ms':>10}  met")
    for name, median, p99, target in rows:
        verdict = "yes" if p99 <= target else "NO"
        print(f"{name:<{width}}  {median:>10.3f}  {p99:>10.3f}  {target:>10.1f}  {verdict}")
    stream_snapshot(rng, repeat=max(3, args.repeat // 20))


def stream_snapshot(rng: random.Random, repeat: int, projects: int = 150, hours: int = 2190) -> None:
    """What the calculator pays per snapshot (`FairShareCalculator.compute`, 150 projects as at the
    institute): re-decay every project-hour of a quarter, build the tree, a full Fair Tree
    recompute; beside it, the recompute alone."""
    clock = hours * HOUR
    usage_hours = {f"p{i}": {h: rng.randrange(1, 10**13) for h in range(hours)} for i in range(projects)}
    nodes = {f"p{i}": Node(f"p{i}", None, "project", rng.randint(1, 100), ()) for i in range(projects)}

    def snapshot() -> object:
        usage = decayed_usage(usage_hours, clock, DEFAULT_HALF_LIFE)
        return compute_fairshare(*share_tree(nodes, usage), Algorithm.FAIR_TREE)

    tree, leaves = share_tree(nodes, decayed_usage(usage_hours, clock, DEFAULT_HALF_LIFE))
    snap_median, snap_p99 = timed(repeat, snapshot)
    tree_median, _ = timed(repeat, functools.partial(compute_fairshare, tree, leaves, Algorithm.FAIR_TREE))
    print(
        f"calculator snapshot, {projects} projects x {hours} hours: median {snap_median:.1f} ms, "
        f"p99 {snap_p99:.1f} ms; the recompute alone {tree_median:.2f} ms "
        f"({snap_median / tree_median:.0f}x: the decay of the hour totals dominates)"
    )


if __name__ == "__main__":
    main()
