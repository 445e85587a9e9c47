"""Who may read what: admins read every project, a lead the projects of the nodes they lead.

One place for the rule, used by the JSON routes and the browser pages alike.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import HTTPException

from allmende.domain.admin_state import AdminState
from allmende.services.api.auth import Principal


def may_read(state: AdminState, principal: Principal, project: str) -> bool:
    return principal.role == "admin" or (
        principal.role == "lead" and principal.name in state.leads_of(project)
    )


def readable_projects(state: AdminState, principal: Principal, with_usage: Iterable[str] = ()) -> list[str]:
    """Declared projects the principal may read; admins also see usage of undeclared projects
    (over budget, never hidden)."""
    declared = state.projects()
    if principal.role == "admin":
        return sorted(set(declared) | set(with_usage))
    return [p for p in declared if may_read(state, principal, p)]


def declared_project(state: AdminState, project: str) -> bool:
    return project in state.nodes and state.nodes[project].kind == "project"


def require_project(state: AdminState, principal: Principal, project: str, has_usage: bool = False) -> None:
    """404 for a project nobody declared (admins: unless it has usage), 403 for another's."""
    declared = declared_project(state, project)
    if not declared and not (has_usage and principal.role == "admin"):
        raise HTTPException(404, f"no project {project!r}")
    if not may_read(state, principal, project):
        raise HTTPException(403, f"{principal.name} does not lead {project} (nor a group above it)")
