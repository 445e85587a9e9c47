"""Who the identity provider's claims make someone (services/api/oidc.py RoleMap), and what a lead
named by a claim reads (services/api/access.py): the rules of docs/auth.md, without an IdP."""

from __future__ import annotations

import pytest

from allmende.core.settings import Settings
from allmende.services.api.access import may_read, own_nodes, readable_projects
from allmende.services.api.auth import Principal, TokenRejected
from allmende.services.api.oidc import RoleMap, claim_values
from tests.unit.test_read_rules import STATE


def roles(**overrides: str) -> RoleMap:
    return RoleMap(Settings(**overrides))  # type: ignore[arg-type]


def test_keycloak_groups_make_admins_and_leads_of_the_nodes_they_name() -> None:
    rm = roles()
    assert rm.principal(
        {"preferred_username": "ada", "groups": ["/allmende-admins", "/leads/nlp"]}
    ) == Principal("ada", "admin")
    lena = rm.principal({"preferred_username": "lena", "groups": ["/leads/nlp", "/staff", "/leads/vision"]})
    assert lena == Principal("lena", "lead", frozenset({"nlp", "vision"}))
    assert rm.principal({"preferred_username": "nils", "groups": ["/staff"]}) is None
    assert rm.principal({"preferred_username": "nils"}) is None  # no claim at all
    # a value that is not a node id never names one
    assert rm.principal({"preferred_username": "x", "groups": ["/leads/../admin", "/leads/a/b"]}) is None


def test_a_dotted_claim_path_and_a_site_pattern() -> None:
    rm = roles(
        oidc_roles_claim="realm_access.roles",
        oidc_admin_values="gpu-admin,ops",
        oidc_lead_pattern="lead-{node}",
    )
    claims = {"sub": "f3a1", "realm_access": {"roles": ["offline_access", "lead-olmo-ft"]}}
    assert rm.principal(claims) == Principal("f3a1", "lead", frozenset({"olmo-ft"}))  # sub: no username
    assert rm.principal({"sub": "b", "realm_access": {"roles": ["ops"]}}) == Principal("b", "admin")
    assert claim_values({"a": {"b": "one"}}, "a.b") == ["one"]
    assert claim_values({"a": ["x", 3, None]}, "a") == ["x"]
    assert claim_values({"a": 7}, "a.b") == []


def test_a_token_with_no_name_is_refused_and_a_pattern_without_a_node_is_a_setup_error() -> None:
    with pytest.raises(TokenRejected):
        roles().principal({"groups": ["/allmende-admins"]})
    with pytest.raises(ValueError, match="must hold"):
        roles(oidc_lead_pattern="/leads/")


def test_a_lead_named_by_the_idp_reads_the_node_and_everything_below_it() -> None:
    # nlp > {olmo-ft, olmo-eval}; the plan names other leads (gina, alice): the claim suffices
    lena = Principal("lena", "lead", frozenset({"nlp"}))
    assert own_nodes(STATE, lena) == {"nlp", "olmo-ft", "olmo-eval"}
    assert readable_projects(STATE, lena) == ["olmo-eval", "olmo-ft"]
    assert may_read(STATE, lena, "olmo-ft") and not may_read(STATE, lena, "vision")
    # a node nobody declared leads to nothing
    ghost = Principal("gus", "lead", frozenset({"ghost"}))
    assert own_nodes(STATE, ghost) == set() and readable_projects(STATE, ghost) == []
