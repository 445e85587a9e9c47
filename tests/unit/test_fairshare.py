"""Fair share: Slurm's classic and Fair Tree factors, over the tree, and the decay factor."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.fairshare.classic import classic_fairshare
from allmende.domain.fairshare.compute import compute_fairshare
from allmende.domain.fairshare.decay import decay_factor
from allmende.domain.fairshare.fair_tree import fair_tree_fairshare
from allmende.domain.fairshare.options import Algorithm, ZeroShares
from allmende.domain.fairshare.result import FairShareResult
from allmende.domain.fairshare.sums import UsageInvalid, aggregate_usage
from allmende.domain.fairshare.tree import ShareNode, Shares, ShareTree, ShareTreeInvalid

PROPERTY = settings(max_examples=200, deadline=None, database=None)
DAY = 86_400
WEEK = 7 * DAY


def tree_of(*edges: tuple[str, str, Shares]) -> ShareTree:
    """A tree from (node, parent, shares) triples."""
    return ShareTree(ShareNode(node, parent, shares) for node, parent, shares in edges)


def leaves_below(tree: ShareTree, node: str) -> list[str]:
    if tree.is_leaf(node):
        return [node]
    return [leaf for child in tree.children(node) for leaf in leaves_below(tree, child)]


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: tree_of(("a", "root", 1), ("a", "root", 2)), "appears twice"),
        (lambda: tree_of(("a", "nowhere", 1)), "unknown parent"),
        (lambda: tree_of(("a", "b", 1), ("b", "a", 1)), "do not lead to the root"),
        (lambda: ShareNode("a", "root", -1), "shares are an integer"),
        (lambda: ShareNode("a", "root", True), "shares are an integer"),
        (lambda: ShareNode("a", "root", "Parent"), "shares are an integer"),  # type: ignore[arg-type]
        (lambda: ShareNode("a", "root", 2**32), "shares are an integer"),
        (lambda: ShareNode("", "root", 1), "non-empty string"),
        (lambda: ShareNode("root", "a", 1), "the root has no parent"),
        (lambda: ShareNode("a", None, 1), "needs a parent id"),
        (lambda: ShareNode("a", "a", 1), "its own parent"),
    ],
    ids=[
        "a duplicate id is refused",
        "an unknown parent is refused",
        "a cycle is refused",
        "negative shares are refused",
        "a bool as shares is refused",
        "a misspelt 'parent' is refused",
        "shares beyond Slurm's uint32 are refused",
        "an empty id is refused",
        "a root with a parent is refused",
        "a node without a parent is refused",
        "a node that is its own parent is refused",
    ],
)
def test_invalid_trees_are_refused_with_a_reason(build: object, message: str) -> None:
    with pytest.raises(ShareTreeInvalid, match=message):
        build()  # type: ignore[operator]


SMALL = tree_of(("acct", "root", 1), ("alice", "acct", 1))


@pytest.mark.parametrize(
    ("usage", "message"),
    [
        ({"acct": 1.0}, "usage is charged to leaves"),
        ({"root": 1.0}, "usage is charged to leaves"),
        ({"bob": 1.0}, "no node 'bob'"),
        ({"alice": -1.0}, "from 0 to"),
        ({"alice": math.nan}, "from 0 to"),
        ({"alice": math.inf}, "from 0 to"),
        ({"alice": True}, "from 0 to"),
    ],
    ids=[
        "usage on an account is refused",
        "usage on the root is refused",
        "usage on an unknown node is refused",
        "negative usage is refused",
        "NaN usage is refused",
        "infinite usage is refused",
        "a bool as usage is refused",
    ],
)
def test_invalid_usage_is_refused_with_a_reason(usage: dict[str, float], message: str) -> None:
    with pytest.raises(UsageInvalid, match=message):
        classic_fairshare(SMALL, usage)


def test_an_explicit_root_is_the_same_as_an_implied_one() -> None:
    explicit = ShareTree(
        [ShareNode("root", None, 5), ShareNode("acct", "root", 1), ShareNode("alice", "acct")]
    )
    assert explicit.ids == SMALL.ids == ("root", "acct", "alice")
    assert explicit.parent("alice") == "acct" and explicit.parent("root") is None
    assert explicit.depth("alice") == 2 and explicit.leaves == ("alice",)


# -- classic: the worked example -----------------------------------------------------------------

# /work/shared/reference/fairshare-classic-example.md (Slurm's classic_fair_share.html). Its usage
# fractions (0.20 + 0.25 + 0.25) leave 0.30 of the machine's usage to associations outside the
# example; a sibling with 0 shares carries it, which changes no share ratio.
EXAMPLE = tree_of(
    ("A", "root", 40),
    ("B", "A", 30),
    ("User1", "B", 1),
    ("C", "A", 10),
    ("User2", "C", 1),
    ("User3", "C", 1),
    ("D", "root", 60),
    ("E", "D", 25),
    ("User4", "E", 1),
    ("F", "D", 35),
    ("User5", "F", 1),
    ("elsewhere", "root", 0),
)
WHOLE = 1_000_000.0  # GPU-seconds; the factors depend on the fractions only
EXAMPLE_USAGE = {
    "User1": 0.20 * WHOLE,
    "User2": 0.25 * WHOLE,
    "User3": 0.0,
    "User4": 0.25 * WHOLE,
    "User5": 0.0,
    "elsewhere": 0.30 * WHOLE,
}

# node: (normalised shares S, effective usage U_E, factor), as documented
EXAMPLE_EXPECTED = {
    "A": (0.4, 0.45, 0.458502),
    "B": (0.3, 0.3875, 0.408479),
    "C": (0.1, 0.3, 0.125000),
    "D": (0.6, 0.25, 0.749154),
    "E": (0.25, 0.25, 0.500000),
    "F": (0.35, 0.145833, 0.749154),
    "User1": (0.3, 0.3875, 0.408479),
    "User2": (0.05, 0.275, 0.022097),
    "User3": (0.05, 0.15, 0.125000),
    "User4": (0.25, 0.25, 0.500000),
    "User5": (0.35, 0.145833, 0.749154),
}


@pytest.mark.parametrize("node", sorted(EXAMPLE_EXPECTED))
def test_the_classic_worked_example_is_reproduced_to_six_decimals(node: str) -> None:
    shares, effective, factor = EXAMPLE_EXPECTED[node]
    row = classic_fairshare(EXAMPLE, EXAMPLE_USAGE).row(node)
    assert round(row.norm_shares, 6) == shares
    assert round(row.effective_usage, 6) == effective
    assert round(row.factor, 6) == factor


def test_the_classic_example_normalises_usage_by_the_roots_total() -> None:
    result = classic_fairshare(EXAMPLE, EXAMPLE_USAGE)
    assert result.row("A").norm_usage == pytest.approx(0.45)
    assert result.row("A").raw_usage == pytest.approx(0.45 * WHOLE)
    assert result.row("root").raw_usage == pytest.approx(WHOLE)
    assert result.factor("elsewhere") == 0.0  # no shares, factor 0, whatever its usage


# -- classic: edge cases -------------------------------------------------------------------------


def test_classic_gives_every_node_with_shares_factor_one_when_nobody_has_used_anything() -> None:
    result = classic_fairshare(EXAMPLE, {})
    assert {node: result.factor(node) for node in EXAMPLE_EXPECTED} == dict.fromkeys(EXAMPLE_EXPECTED, 1.0)
    assert result.factor("elsewhere") == 0.0


def test_classic_gives_zero_to_a_node_without_shares_and_to_everything_below_it() -> None:
    tree = tree_of(("A", "root", 1), ("a1", "A", 0), ("a2", "A", 1), ("Z", "root", 0), ("z1", "Z", 5))
    result = classic_fairshare(tree, {"a2": 10.0})
    assert (result.factor("a1"), result.factor("Z"), result.factor("z1")) == (0.0, 0.0, 0.0)
    assert result.factor("a2") > 0


def test_classic_gives_a_parent_shares_leaf_its_parents_factor() -> None:
    tree = tree_of(("A", "root", 1), ("p", "A", "parent"), ("a1", "A", 1), ("B", "root", 1), ("b1", "B", 1))
    result = classic_fairshare(tree, {"p": 4.0, "a1": 1.0, "b1": 2.0})
    assert result.factor("p") == result.factor("A")
    assert result.row("p").effective_usage == result.row("A").effective_usage
    assert result.row("p").norm_shares == result.row("A").norm_shares


# -- "parent" accounts are transparent in both algorithms -----------------------------------------

WITH_PARENT_ACCOUNT = tree_of(
    ("A", "root", 2),
    ("P", "A", "parent"),
    ("x", "P", 1),
    ("y", "P", 3),
    ("z", "A", 1),
    ("B", "root", 1),
    ("w", "B", 1),
)
FLATTENED = tree_of(
    ("A", "root", 2), ("x", "A", 1), ("y", "A", 3), ("z", "A", 1), ("B", "root", 1), ("w", "B", 1)
)


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_the_children_of_a_parent_shares_account_compete_as_if_it_were_not_there(
    algorithm: Algorithm,
) -> None:
    usage = {"x": 5.0, "y": 1.0, "z": 7.0, "w": 3.0}
    nested = compute_fairshare(WITH_PARENT_ACCOUNT, usage, algorithm)
    flat = compute_fairshare(FLATTENED, usage, algorithm)
    assert {leaf: nested.factor(leaf) for leaf in "xyzw"} == {leaf: flat.factor(leaf) for leaf in "xyzw"}
    assert nested.factor("P") == nested.factor("A")
    assert nested.row("P").raw_shares == "parent"
    assert nested.row("P").raw_usage == pytest.approx(6.0)


# -- Fair Tree -----------------------------------------------------------------------------------


def test_fair_tree_ranks_every_user_of_the_better_served_account_above_the_other_accounts_users() -> None:
    # Level A: S = 0.5, U = 40/100 -> LF 1.25; B: S = 0.5, U = 60/100 -> LF 0.83. So A's users come
    # first, even though b2 has used nothing (LF infinite within B): Fair Tree compares accounts
    # before users. Within A: a1 LF 0.5/0.25 = 2 beats a2 0.5/0.75; within B, b2 beats b1.
    tree = tree_of(
        ("A", "root", 50), ("a1", "A", 1), ("a2", "A", 1), ("B", "root", 50), ("b1", "B", 1), ("b2", "B", 1)
    )
    result = fair_tree_fairshare(tree, {"a1": 10.0, "a2": 30.0, "b1": 60.0})
    assert [row.node_id for row in result.ranked()] == ["a1", "a2", "b2", "b1"]
    assert [row.factor for row in result.ranked()] == [1.0, 0.75, 0.5, 0.25]
    assert result.row("A").level_fs == pytest.approx(1.25)
    assert result.row("b2").level_fs == math.inf
    # Classic, for contrast, lets b2 (U_E 0.3, factor 2^-1.2) overtake a2 (U_E 0.35, 2^-1.4).
    classic = classic_fairshare(tree, {"a1": 10.0, "a2": 30.0, "b1": 60.0})
    assert [row.node_id for row in classic.ranked()] == ["a1", "b2", "a2", "b1"]


def test_fair_tree_gives_tied_sibling_users_the_same_rank_and_counts_them_below() -> None:
    # B has no usage (LF infinite) so b1 is first. In A, a1 and a2 have the same shares and usage,
    # so the same LF: they share rank 3 of 4; a3 gets rank 1, not 2, as ranks count every user.
    tree = tree_of(
        ("A", "root", 1), ("a1", "A", 1), ("a2", "A", 1), ("a3", "A", 1), ("B", "root", 1), ("b1", "B", 1)
    )
    result = fair_tree_fairshare(tree, {"a1": 10.0, "a2": 10.0, "a3": 30.0})
    assert (result.factor("b1"), result.factor("a1"), result.factor("a2"), result.factor("a3")) == (
        1.0,
        0.75,
        0.75,
        0.25,
    )


def test_fair_tree_merges_tied_sibling_accounts_and_sorts_their_users_together() -> None:
    # A and B have equal shares and equal usage (40 each): tied, so their users are sorted as one
    # account: a2 (LF 0.5/0.25 = 2) first, b1 and b2 (LF 1, tied) next, a1 (LF 0.67) last. Taken
    # one account after the other, a1 would have come second.
    tree = tree_of(
        ("A", "root", 1), ("a1", "A", 1), ("a2", "A", 1), ("B", "root", 1), ("b1", "B", 1), ("b2", "B", 1)
    )
    result = fair_tree_fairshare(tree, {"a1": 30.0, "a2": 10.0, "b1": 20.0, "b2": 20.0})
    assert result.factor_map() == {
        "root": 1.0,
        "A": 1.0,
        "a1": 0.25,
        "a2": 1.0,
        "B": 1.0,
        "b1": 0.75,
        "b2": 0.75,
    }


def test_fair_tree_gives_a_user_tied_with_a_sibling_account_the_rank_of_that_accounts_first_user() -> None:
    # u and A both have S 0.5 and U 0.5: tied. u sorts first (users before accounts) with rank 3;
    # A's first user, a2 (no usage), shares it; a1 then gets rank 1.
    tree = tree_of(("u", "root", 1), ("A", "root", 1), ("a1", "A", 1), ("a2", "A", 1))
    result = fair_tree_fairshare(tree, {"u": 10.0, "a1": 10.0})
    assert (result.factor("u"), result.factor("a2"), result.factor("a1")) == pytest.approx((1.0, 1.0, 1 / 3))


ZERO_SHARE_LEAF = tree_of(("A", "root", 1), ("a0", "A", 0), ("a1", "A", 1), ("B", "root", 1), ("b1", "B", 1))


def test_fair_tree_ranks_a_leaf_without_shares_after_its_siblings_and_still_counts_it() -> None:
    # A is better served than B (LF 0.5/(5/15) = 1.5 against 0.5/(10/15) = 0.75), so A's leaves
    # come first: a1 (LF 1) on top, then a0, whose 0 shares make its LF 0. As in Slurm, a0 still
    # takes a rank, 2 of 3, so b1 gets rank 1.
    result = fair_tree_fairshare(ZERO_SHARE_LEAF, {"a1": 5.0, "b1": 10.0})
    assert result.row("a0").level_fs == 0.0
    assert (result.factor("a1"), result.factor("a0"), result.factor("b1")) == (3 / 3, 2 / 3, 1 / 3)


def test_zero_shares_unranked_gives_a_leaf_without_shares_zero_and_moves_the_leaves_after_it_up() -> None:
    # The former rule, kept behind ZeroShares.UNRANKED: a0 gets 0 and takes no rank number, so b1
    # gets rank 2 of the 3 leaves (2/3) where Slurm gives it rank 1.
    result = fair_tree_fairshare(ZERO_SHARE_LEAF, {"a1": 5.0, "b1": 10.0}, zero_shares=ZeroShares.UNRANKED)
    assert result.factor("a0") == 0.0
    assert result.row("a0").level_fs == 0.0
    assert (result.factor("a1"), result.factor("b1")) == (3 / 3, 2 / 3)
    assert [row.node_id for row in result.ranked()][-1] == "a0"


ZERO_SHARE_ACCOUNT = tree_of(
    ("A", "root", 1), ("a1", "A", 1), ("Z", "root", 0), ("z1", "Z", 1), ("z2", "Z", 3)
)


def test_fair_tree_ranks_the_leaves_below_an_account_without_shares_by_their_own_level_fair_share() -> None:
    # Z's 0 shares make its LF 0, so A (LF 1/(5/10) = 2) comes first: a1 rank 3 of 3. Inside Z
    # the shares are z1's 1 and z2's 3: z2 has no usage (LF inf) and ranks 2, z1 (LF 0.25/1) 1.
    result = fair_tree_fairshare(ZERO_SHARE_ACCOUNT, {"a1": 5.0, "z1": 5.0})
    assert result.row("Z").level_fs == 0.0
    assert (result.row("z1").level_fs, result.row("z2").level_fs) == (0.25, math.inf)
    assert (result.factor("a1"), result.factor("z2"), result.factor("z1")) == (3 / 3, 2 / 3, 1 / 3)
    assert result.factor("Z") == 2 / 3  # its first ranked leaf's


def test_zero_shares_unranked_gives_zero_to_every_leaf_below_an_account_without_shares() -> None:
    result = fair_tree_fairshare(ZERO_SHARE_ACCOUNT, {"a1": 5.0, "z1": 5.0}, zero_shares=ZeroShares.UNRANKED)
    assert (result.factor("Z"), result.factor("z1"), result.factor("z2")) == (0.0, 0.0, 0.0)
    assert result.factor("a1") == 1.0


# Slurm's Fair Tree with 0 shares, worked by hand. Raw shares in brackets, usage in GPU-seconds:
#
#   root (usage 100)
#   +- A [60]  usage 40: a1 [1] 10, a2 [1] 20, a0 [0] 10
#   +- B [30]  usage 25: b1 [1] 15, Z [0] (usage 10: z1 [1] 10, z2 [3] 0)
#   +- D [10]  usage 35: d1 [1] 35
#
# LF = S / U, S = raw / siblings' raw, U = usage / parent's usage, 0 when S is 0 (fair_tree.c,
# _calc_assoc_fs):
#   root's children: A 0.6/0.40 = 1.5;  B 0.3/0.25 = 1.2;  D 0.1/0.35 = 0.286  -> A, B, D
#   in A (shares 1+1+0): a1 0.5/0.25 = 2;  a2 0.5/0.5 = 1;  a0 S = 0 -> 0       -> a1, a2, a0
#   in B (shares 1+0):   b1 1/0.6 = 1.67;  Z S = 0 -> 0                          -> b1, Z
#   in Z (shares 1+3):   z2 0.75/0 = inf;  z1 0.25/1 = 0.25                      -> z2, z1
#   in D:                d1 1/1 = 1
# Depth first, each leaf takes the next rank down from 7 (the number of leaves), factor rank / 7:
#   a1 7, a2 6, a0 5, b1 4, z2 3, z1 2, d1 1.
# The former rule (ZeroShares.UNRANKED) gave a0, z2 and z1 0 and no rank, which moved the leaves
# after them up: b1 5/7 instead of 4/7, d1 4/7 instead of 1/7.
SLURM_ZERO_SHARES = tree_of(
    ("A", "root", 60),
    ("a1", "A", 1),
    ("a2", "A", 1),
    ("a0", "A", 0),
    ("B", "root", 30),
    ("b1", "B", 1),
    ("Z", "B", 0),
    ("z1", "Z", 1),
    ("z2", "Z", 3),
    ("D", "root", 10),
    ("d1", "D", 1),
)
SLURM_ZERO_SHARES_USAGE = {"a1": 10.0, "a2": 20.0, "a0": 10.0, "b1": 15.0, "z1": 10.0, "z2": 0.0, "d1": 35.0}
SLURM_ZERO_SHARES_RANKS = {"a1": 7, "a2": 6, "a0": 5, "b1": 4, "z2": 3, "z1": 2, "d1": 1}


def test_fair_tree_ranks_zero_share_users_and_accounts_last_among_their_siblings_as_slurm_does() -> None:
    result = fair_tree_fairshare(SLURM_ZERO_SHARES, SLURM_ZERO_SHARES_USAGE)
    levels = {
        "A": 1.5,
        "B": 1.2,
        "D": 0.1 / 0.35,
        "a1": 2,
        "a2": 1,
        "a0": 0,
        "b1": 1 / 0.6,
        "Z": 0,
        "z1": 0.25,
    }
    assert {node: result.row(node).level_fs for node in levels} == pytest.approx(levels)
    assert result.row("z2").level_fs == math.inf
    expected = {leaf: rank / 7 for leaf, rank in SLURM_ZERO_SHARES_RANKS.items()}
    expected |= {"root": 7 / 7, "A": 7 / 7, "B": 4 / 7, "Z": 3 / 7, "D": 1 / 7}  # first leaf ranked inside
    assert result.factor_map() == expected
    assert [row.node_id for row in result.ranked()] == ["a1", "a2", "a0", "b1", "z2", "z1", "d1"]


def test_zero_shares_unranked_moves_the_leaves_ranked_after_zero_share_nodes_up() -> None:
    expected = {"a1": 7 / 7, "a2": 6 / 7, "a0": 0.0, "b1": 5 / 7, "z2": 0.0, "z1": 0.0, "d1": 4 / 7}
    expected |= {"root": 7 / 7, "A": 7 / 7, "B": 5 / 7, "Z": 0.0, "D": 4 / 7}
    unranked = fair_tree_fairshare(
        SLURM_ZERO_SHARES, SLURM_ZERO_SHARES_USAGE, zero_shares=ZeroShares.UNRANKED
    )
    assert unranked.factor_map() == expected


def test_a_zero_share_user_and_a_zero_share_sibling_account_tie_at_level_fair_share_zero() -> None:
    # Usage a1 10, u0 10, z1 10, b1 100 (root 130). Root: A 0.5/(30/130) = 2.17 before B
    # 0.5/(100/130) = 0.65. In A (shares 1+0+0+0): a1 1/(10/30) = 3, then u0, v0 and Z, all LF 0:
    # leaves before accounts, so u0, v0, Z. 6 leaves, ranks from 6 down (fair_tree.c, _calc_tree_fs):
    #   a1 6;  u0 5 (not tied with a1);  v0 tied with u0: 5 too;
    #   Z tied with v0 (a user tied with a sibling account shares its first user's rank): in Z,
    #   z2 (no usage, inf) comes first and takes the rank it inherits, 5; z1 (0.5/1) gets 2, as
    #   every user counted (a1, u0, v0, z2) took a number;  then B: b1 1.
    tree = tree_of(
        ("A", "root", 1),
        ("a1", "A", 1),
        ("u0", "A", 0),
        ("v0", "A", 0),
        ("Z", "A", 0),
        ("z1", "Z", 1),
        ("z2", "Z", 1),
        ("B", "root", 1),
        ("b1", "B", 1),
    )
    usage = {"a1": 10.0, "u0": 10.0, "z1": 10.0, "b1": 100.0}
    expected = {"a1": 6 / 6, "u0": 5 / 6, "v0": 5 / 6, "z2": 5 / 6, "z1": 2 / 6, "b1": 1 / 6}
    expected |= {"root": 6 / 6, "A": 6 / 6, "Z": 5 / 6, "B": 1 / 6}
    assert fair_tree_fairshare(tree, usage).factor_map() == expected


def test_fair_tree_ranks_a_parent_shares_leaf_at_the_top_of_its_parent_which_is_the_parents_factor() -> None:
    # B is far better served (LF 13 against 0.52), so b1 is first. In A, p ("parent") has an
    # infinite LF as in Slurm, tied with a1, which has no usage; a2 comes last.
    tree = tree_of(
        ("A", "root", 1),
        ("a1", "A", 1),
        ("a2", "A", 1),
        ("p", "A", "parent"),
        ("B", "root", 1),
        ("b1", "B", 1),
    )
    result = fair_tree_fairshare(tree, {"p": 5.0, "a2": 20.0, "b1": 1.0})
    assert result.factor("b1") == 1.0
    assert result.factor("p") == result.factor("A") == result.factor("a1") == 0.75
    assert result.factor("a2") == 0.25
    assert result.row("p").level_fs == math.inf


def test_fair_tree_ties_everyone_at_the_top_when_nobody_has_used_anything() -> None:
    # Everyone with shares ties at LF inf; "elsewhere" (0 shares, LF 0) comes after them, and as
    # all five above it took a rank number, it gets the last: 1 of 6.
    result = fair_tree_fairshare(EXAMPLE, {})
    assert {row.node_id: row.factor for row in result.ranked()} == {
        **dict.fromkeys(["User1", "User2", "User3", "User4", "User5"], 1.0),
        "elsewhere": 1 / 6,
    }
    unranked = fair_tree_fairshare(EXAMPLE, {}, zero_shares=ZeroShares.UNRANKED)
    assert unranked.factor("User1") == 1.0 and unranked.factor("elsewhere") == 0.0


def test_fair_tree_on_the_classic_example_follows_the_level_fair_shares() -> None:
    # D (LF 0.6/0.25 = 2.4) beats A (0.4/0.45 = 0.89): D's users first, F's User5 (no usage) on top.
    result = fair_tree_fairshare(EXAMPLE, EXAMPLE_USAGE)
    assert [row.node_id for row in result.ranked()] == [
        "User5",
        "User4",
        "User1",
        "User3",
        "User2",
        "elsewhere",
    ]
    assert [row.factor for row in result.ranked()] == [6 / 6, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6]


# -- results -------------------------------------------------------------------------------------


def test_rows_come_in_sshare_order_with_parents_and_depths() -> None:
    result = classic_fairshare(EXAMPLE, EXAMPLE_USAGE)
    rows = result.rows()
    assert [row.node_id for row in rows] == list(EXAMPLE.ids)
    assert [row.node_id for row in rows][:4] == ["root", "A", "B", "User1"]
    assert rows[3].parent_id == "B" and rows[3].depth == 3 and rows[3].is_leaf
    assert rows[0].parent_id is None and rows[0].raw_shares == 1 and rows[0].norm_shares == 1.0
    assert result.row("A").raw_shares == 40 and result.row("A").level_fs is None


def test_aggregate_usage_sums_the_leaves_below_every_node() -> None:
    usage = aggregate_usage(EXAMPLE, EXAMPLE_USAGE)
    assert usage["A"] == 0.45 * WHOLE and usage["root"] == WHOLE and usage["User3"] == 0.0


def test_compute_fairshare_selects_the_algorithm_by_name() -> None:
    assert compute_fairshare(EXAMPLE, EXAMPLE_USAGE, Algorithm("classic")).algorithm is Algorithm.CLASSIC
    assert compute_fairshare(EXAMPLE, EXAMPLE_USAGE).algorithm is Algorithm.FAIR_TREE


def test_the_zero_shares_rule_is_chosen_by_name_and_classic_ignores_it() -> None:
    unranked = compute_fairshare(EXAMPLE, EXAMPLE_USAGE, zero_shares=ZeroShares("unranked"))
    assert unranked.factor("elsewhere") == 0.0
    assert compute_fairshare(EXAMPLE, EXAMPLE_USAGE).factor("elsewhere") == 1 / 6
    classic = [
        compute_fairshare(EXAMPLE, EXAMPLE_USAGE, Algorithm.CLASSIC, zero_shares=z) for z in ZeroShares
    ]
    assert classic[0] == classic[1]
    with pytest.raises(ValueError, match="is not a valid ZeroShares"):
        compute_fairshare(EXAMPLE, EXAMPLE_USAGE, zero_shares="none")  # type: ignore[arg-type]


# -- decay ---------------------------------------------------------------------------------------


def test_the_decay_factor_halves_exactly_at_every_half_life_and_is_one_without_decay() -> None:
    assert decay_factor(3 * WEEK, WEEK) == 0.125 and decay_factor(5, 0) == 1.0
    assert decay_factor(WEEK // 2, WEEK) == pytest.approx(1 / math.sqrt(2), rel=1e-15)


# Accounts without a ranked leaf exist only under ZeroShares.UNRANKED (Slurm ranks every leaf):
# the next three tests hold that rule's account factors, and the fourth gives the same trees
# under Slurm's rule.
UNRANKED = ZeroShares.UNRANKED
ONLY_LEAF_WITHOUT_SHARES = tree_of(("A", "root", 1), ("a0", "A", 0), ("B", "root", 1), ("b1", "B", 1))
TIED_BELOW_C = tree_of(
    ("A", "root", 1), ("a0", "A", 0), ("B", "root", 1), ("b1", "B", 1), ("C", "root", 1), ("c1", "C", 1)
)
TIED_TWO_LEVELS = tree_of(
    ("P", "root", 1), ("X", "P", 1), ("x0", "X", 0), ("Q", "root", 1), ("Y", "Q", 1), ("y1", "Y", 1)
)


def test_an_account_whose_only_leaf_has_no_shares_gets_the_factor_of_the_account_it_is_tied_with() -> None:
    # Unranked: A's only leaf, a0, has 0 shares, so A has no ranked leaf of its own. With no usage
    # A and B tie at LF inf, Slurm merges them, and b1 (rank 2 of 2) is the group's first ranked
    # leaf: A shares its factor, as B does.
    tree = ONLY_LEAF_WITHOUT_SHARES
    expected = {"root": 1.0, "A": 1.0, "a0": 0.0, "B": 1.0, "b1": 1.0}
    assert fair_tree_fairshare(tree, {}, zero_shares=UNRANKED).factor_map() == expected
    # Equal usage keeps them tied below C (LF 1/3 / 1/2 each, C's inf): A gets b1's 2 of 3 leaves.
    tree, usage = TIED_BELOW_C, {"a0": 10.0, "b1": 10.0}
    expected = {"root": 1.0, "A": 2 / 3, "a0": 0.0, "B": 2 / 3, "b1": 2 / 3, "C": 1.0, "c1": 1.0}
    assert fair_tree_fairshare(tree, usage, zero_shares=UNRANKED).factor_map() == expected


def test_an_account_without_a_ranked_leaf_gets_zero_once_no_sibling_account_is_tied_with_it() -> None:
    # Unranked: b1 uses something: B's LF drops to 0.5 while A's stays inf, so A is alone in its
    # group, which has no ranked leaf.
    tree, usage = ONLY_LEAF_WITHOUT_SHARES, {"b1": 10.0}
    expected = {"root": 1.0, "A": 0.0, "a0": 0.0, "B": 1.0, "b1": 1.0}
    assert fair_tree_fairshare(tree, usage, zero_shares=UNRANKED).factor_map() == expected


def test_an_account_without_a_ranked_leaf_tied_inside_a_merged_group_gets_that_groups_factor() -> None:
    # Unranked: P and Q tie (no usage), so their children X and Y are sorted together, tie in turn
    # and merge: y1 is the first ranked leaf, and X and P, with no ranked leaf of their own, share
    # its factor.
    tree = TIED_TWO_LEVELS
    expected = dict.fromkeys(tree.ids, 1.0) | {"x0": 0.0}
    assert fair_tree_fairshare(tree, {}, zero_shares=UNRANKED).factor_map() == expected


@pytest.mark.parametrize(
    ("tree", "usage", "expected"),
    [
        # A and B tie at inf and merge: b1 (inf) ranks 2 of 2, a0 (0 shares, LF 0) 1 of 2.
        (ONLY_LEAF_WITHOUT_SHARES, {}, {"root": 1.0, "A": 1.0, "a0": 1 / 2, "B": 1.0, "b1": 1.0}),
        # C (inf) first: c1 3 of 3. A and B tie at 2/3 and merge: b1 (LF 1) 2, a0 (LF 0) 1.
        (
            TIED_BELOW_C,
            {"a0": 10.0, "b1": 10.0},
            {"root": 1.0, "A": 2 / 3, "a0": 1 / 3, "B": 2 / 3, "b1": 2 / 3, "C": 1.0, "c1": 1.0},
        ),
        # A (inf) before B (0.5): a0, alone in A, ranks 2 of 2 whatever its shares; b1 1 of 2.
        (ONLY_LEAF_WITHOUT_SHARES, {"b1": 10.0}, {"root": 1.0, "A": 1.0, "a0": 1.0, "B": 1 / 2, "b1": 1 / 2}),
        # Everything ties and merges down to X and Y's leaves: y1 (inf) 2 of 2, x0 (LF 0) 1 of 2.
        (TIED_TWO_LEVELS, {}, dict.fromkeys(TIED_TWO_LEVELS.ids, 1.0) | {"x0": 1 / 2}),
    ],
    ids=["tied at the top", "tied below another", "not tied", "tied two levels down"],
)
def test_under_slurms_rule_a_leaf_without_shares_takes_the_last_rank_of_its_group(
    tree: ShareTree, usage: dict[str, float], expected: dict[str, float]
) -> None:
    assert fair_tree_fairshare(tree, usage).factor_map() == expected


SHARE_CHOICES: list[Shares] = [0, 1, 1, 2, 3, 10, "parent"]
SHARES = st.sampled_from(SHARE_CHOICES)
AMOUNTS = st.one_of(st.sampled_from([0.0, 1.0, 2.0, 0.5, 3600.0]), st.floats(0, 1e7))


@st.composite
def trees(draw: st.DrawFn, shares: st.SearchStrategy[Shares] = SHARES) -> ShareTree:
    """Random trees: accounts hung under earlier accounts, then leaves; some accounts stay empty."""
    nodes, accounts = [], ["root"]
    for k in range(draw(st.integers(0, 6))):
        nodes.append(ShareNode(f"acct{k}", draw(st.sampled_from(accounts)), draw(shares)))
        accounts.append(f"acct{k}")
    for k in range(draw(st.integers(1, 12))):
        nodes.append(ShareNode(f"user{k}", draw(st.sampled_from(accounts)), draw(shares)))
    return ShareTree(nodes)


@PROPERTY
@given(
    trees(shares=st.sampled_from(list[Shares]([0, 1, 2, 5]))), st.data(), st.sampled_from(list(ZeroShares))
)
def test_fair_tree_ranks_all_leaves_of_a_better_served_account_above_those_of_its_sibling(
    tree: ShareTree, data: st.DataObject, zero_shares: ZeroShares
) -> None:
    usage = {leaf: data.draw(AMOUNTS) for leaf in tree.leaves}
    result = fair_tree_fairshare(tree, usage, zero_shares=zero_shares)
    accounts = [node for node in tree.ids if node != "root" and not tree.is_leaf(node)]
    for a in accounts:
        for b in accounts:
            level_a, level_b = result.row(a).level_fs, result.row(b).level_fs
            if tree.parent(a) != tree.parent(b) or level_a is None or level_b is None or level_a <= level_b:
                continue
            ranked_a = [result.factor(leaf) for leaf in leaves_below(tree, a) if result.factor(leaf) > 0]
            ranked_b = [result.factor(leaf) for leaf in leaves_below(tree, b) if result.factor(leaf) > 0]
            if ranked_a and ranked_b:
                assert min(ranked_a) > max(ranked_b)


@PROPERTY
@given(trees(), st.data())
def test_fair_tree_gives_the_top_ranked_leaf_one_and_factors_only_from_ranks(
    tree: ShareTree, data: st.DataObject
) -> None:
    usage = {leaf: data.draw(AMOUNTS) for leaf in tree.leaves}
    result: FairShareResult = fair_tree_fairshare(tree, usage)
    factors = [result.factor(leaf) for leaf in tree.leaves]
    ranked = [f for f in factors if f > 0]
    if ranked:
        assert max(ranked) == 1.0
    assert all(round(f * len(factors)) == pytest.approx(f * len(factors)) for f in factors)
    assert min(factors) >= 1 / len(factors)  # Slurm ranks every leaf, shares or not


def slurm_fair_tree(tree: ShareTree, usage: dict[str, float]) -> dict[str, float]:
    """A port of Slurm's Fair Tree walk (fair_tree.c: _calc_assoc_fs, _cmp_level_fs, _calc_tree_fs)
    for trees without "parent" shares: every leaf's factor. Tied sibling accounts are merged as
    _calc_tree_fs documents it (tie rule 2)."""
    total = aggregate_usage(tree, usage)
    users = len(tree.leaves)
    level_fs: dict[str, float] = {}
    factors: dict[str, float] = {}
    rank = rnt = users

    def calc_assoc_fs(node: str) -> None:
        parent = tree.parent(node) or "root"
        level_shares = sum(int(tree.shares(sibling)) for sibling in tree.children(parent))
        s = int(tree.shares(node)) / level_shares if level_shares else 0.0
        u = total[node] / total[parent] if total[parent] else 0.0
        level_fs[node] = 0.0 if s == 0 else math.inf if u == 0 else s / u  # S == 0: the lowest LF

    def calc_tree_fs(siblings: list[str], account_tied: bool) -> None:
        nonlocal rank, rnt
        for node in siblings:
            calc_assoc_fs(node)
        siblings = sorted(siblings, key=lambda n: (-level_fs[n], not tree.is_leaf(n)))  # users first
        previous: float | None = None
        i = 0
        while i < len(siblings):
            node = siblings[i]
            tied = account_tied if i == 0 else previous == level_fs[node]
            if tree.is_leaf(node):  # a user: shares or not, it gets the current rank
                if not tied:
                    rank = rnt
                factors[node] = rank / users
                rnt -= 1
            else:
                end = i + 1
                while end < len(siblings) and not tree.is_leaf(siblings[end]):
                    if level_fs[siblings[end]] != level_fs[node]:
                        break
                    end += 1
                calc_tree_fs([child for a in siblings[i:end] for child in tree.children(a)], tied)
                i = end - 1
            previous = level_fs[node]
            i += 1

    calc_tree_fs(list(tree.children("root")), False)
    return factors


@PROPERTY
@given(trees(shares=st.sampled_from(list[Shares]([0, 0, 1, 2, 3, 10]))), st.data())
def test_fair_tree_gives_every_leaf_the_factor_slurms_walk_gives_it(
    tree: ShareTree, data: st.DataObject
) -> None:
    # Whole GPU-seconds keep every sum exact, so both sides compute the same level fair shares.
    usage = {leaf: float(data.draw(st.sampled_from([0, 0, 1, 2, 3, 5, 10, 3600]))) for leaf in tree.leaves}
    result = fair_tree_fairshare(tree, usage)
    assert {leaf: result.factor(leaf) for leaf in tree.leaves} == slurm_fair_tree(tree, usage)


@PROPERTY
@given(trees(), st.data())
def test_unranked_zero_shares_keeps_the_order_of_the_other_leaves_and_only_moves_them_up(
    tree: ShareTree, data: st.DataObject
) -> None:
    usage = {leaf: data.draw(AMOUNTS) for leaf in tree.leaves}
    slurm = fair_tree_fairshare(tree, usage)
    unranked = fair_tree_fairshare(tree, usage, zero_shares=ZeroShares.UNRANKED)
    with_shares = [leaf for leaf in tree.leaves if unranked.factor(leaf) > 0]
    for x in with_shares:
        assert unranked.factor(x) >= slurm.factor(x)
        for y in with_shares:
            assert (slurm.factor(x) > slurm.factor(y)) == (unranked.factor(x) > unranked.factor(y))
