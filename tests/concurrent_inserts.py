"""Concurrent inserts that repeat keys: each one's outcome, for tests of a transaction stream."""

from __future__ import annotations

import asyncio

from aggclient import AsyncClient
from aggview import errors


async def insert_each(client: AsyncClient, table: str, count: int, keys: int) -> list[int | str]:
    """Inserts rows ``{"id": i % keys, "n": i}`` for i below ``count``, all at once: each i
    whose insert committed, or the reason a repeated id was refused."""

    async def insert(i: int) -> int | str:
        try:
            async with client.transaction() as tx:
                tx.insert(table, {"id": i % keys, "n": i})
            return i
        except errors.AlreadyExists as exc:
            return str(exc)

    return list(await asyncio.gather(*(insert(i) for i in range(count))))
