"""Named dependencies: what a route needs, taken from the app's state (built in the lifespan)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from allmende.core.ledger_store import LedgerStore
from allmende.services.admin_service import AdminService
from allmende.streams.ledger_writer import LedgerWriter


async def _store(request: Request) -> LedgerStore:
    store: LedgerStore = request.app.state.store
    return store


async def _writer(request: Request) -> LedgerWriter | None:
    writer: LedgerWriter | None = request.app.state.writer
    return writer


Store = Annotated[LedgerStore, Depends(_store)]
Writer = Annotated[LedgerWriter | None, Depends(_writer)]


async def _admin_service(request: Request) -> AdminService:
    service: AdminService = request.app.state.admin
    return service


Admins = Annotated[AdminService, Depends(_admin_service)]
