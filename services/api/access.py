"""Who may read what: admins read everything, a lead the nodes they lead and everything below them.

One place for the rule, used by the JSON routes and the browser pages alike (docs/security.md):

- a lead's *own* nodes are the nodes they lead and every node below them (their subtrees); they
  read those nodes' projects, balances, usage and fair-share figures;
- the *path* of a lead is the ancestors of their own nodes up to the root: shown where a tree
  is answered, so the own nodes have a place, with ids and shares only (an ancestor's usage and
  factor add up other branches' usage, its leads are other people);
- the scheduler reads no project: it gets the fair-share factors of the projects (what admission
  and the agent's queue order need) and nothing of the organisation.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import HTTPException

from allmende.domain.admin_state import AdminState
from allmende.domain.organisation import path_to_root
from allmende.services.api.auth import Principal


def led_nodes(state: AdminState, principal: Principal) -> set[str]:
    """The declared nodes a lead leads: those whose plan names them, and those the identity
    provider's claims give them (Principal.led)."""
    if principal.role != "lead":
        return set()
    return {
        n.node_id for n in state.nodes.values() if principal.name in n.leads or n.node_id in principal.led
    }


def may_read(state: AdminState, principal: Principal, project: str) -> bool:
    if principal.role == "admin":
        return True
    if principal.role != "lead":
        return False
    if principal.name in state.leads_of(project):
        return True
    return bool(principal.led) and bool(principal.led.intersection(path_to_root(state.nodes, project)))


def readable_projects(state: AdminState, principal: Principal, with_usage: Iterable[str] = ()) -> list[str]:
    """Declared projects the principal may read; admins also see usage of undeclared projects
    (over budget, never hidden)."""
    declared = state.projects()
    if principal.role == "admin":
        return sorted(set(declared) | set(with_usage))
    return [p for p in declared if may_read(state, principal, p)]


def own_nodes(state: AdminState, principal: Principal) -> set[str]:
    """The nodes the principal reads in full: every node for an admin; for a lead the nodes they
    lead and their subtrees; nothing for anyone else."""
    if principal.role == "admin":
        return set(state.nodes)
    led = led_nodes(state, principal)
    if not led:
        return set()
    return {node for node in state.nodes if led.intersection(path_to_root(state.nodes, node))}


def path_nodes(state: AdminState, own: Iterable[str]) -> set[str]:
    """The ancestors of `own` that are not in it (declared nodes; the implicit root excluded)."""
    mine = set(own)
    return {a for node in mine for a in path_to_root(state.nodes, node)[1:]} - mine


def declared_project(state: AdminState, project: str) -> bool:
    return project in state.nodes and state.nodes[project].kind == "project"


def require_project(state: AdminState, principal: Principal, project: str, has_usage: bool = False) -> None:
    """404 for a project nobody declared (admins: unless it has usage), 403 for another's."""
    declared = declared_project(state, project)
    if not declared and not (has_usage and principal.role == "admin"):
        raise HTTPException(404, f"no project {project!r}")
    if not may_read(state, principal, project):
        raise HTTPException(403, f"{principal.name} does not lead {project} (nor a group above it)")
