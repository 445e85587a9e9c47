"""Hierarchical fair share as Slurm computes it (classic and Fair Tree), over decayed GPU usage.

A fair-share factor says how far an association (a project, a user) is below or above its share of
the machine, so that a scheduler can favour the under-served. This package is the maths only: no
I/O, so the calculator (`streams/fairshare_calculator.py`), a replay and a test all run the same
code. The calculator folds ledger entries into a `UsageLedger` (charge units per project and hour),
decays the hours to the stream's clock (`decayed_usage`), builds the tree of the organisation
(`share_tree`) and calls `compute_fairshare` on each snapshot.

Import from the module that holds a name:

- `tree`: `ShareNode`, `ShareTree`, `ROOT`, `PARENT`, `Shares`, `ShareTreeInvalid`
- `options`: `Algorithm`, `ZeroShares` (Fair Tree's rule for leaves without shares)
- `sums`: leaf usage as exact integer sums up the tree; `aggregate_usage`, `UsageInvalid`
- `decay`: `decay_factor`, `DEFAULT_HALF_LIFE`
- `result`: `ShareRow`, `FairShareResult` (every node's `sshare -l` figures)
- `classic`: `classic_fairshare`
- `fair_tree`: `fair_tree_fairshare`
- `compute`: `compute_fairshare`, either algorithm by name
- `usage`: `UsageLedger`, `decayed_usage`, `share_tree`: from ledger entries to the tree and usage
"""
