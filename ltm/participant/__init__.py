"""The local transaction manager's logic, free of gRPC so tests can drive it directly.

A participant owns the rows whose partition (``aggview.partition_map``) is its index. It keeps
the rows it has touched in memory (loaded lazily from the store, clean ones evicted when the
cache is full), runs sub-transactions in timestamp order (``ltm.rows``), makes every PREPARED
record durable before it votes yes, and checkpoints committed rows to the store so the log
stays short. On start it replays the log over the store; a transaction still undecided there
is kept prepared until the coordinator tells its outcome.
"""

from __future__ import annotations

import asyncio

from ltm.participant.checkpoints import Checkpoints
from ltm.participant.decisions import Decisions
from ltm.participant.operations import Outcome, RowId, VoteNo
from ltm.participant.prepare import Prepares
from ltm.participant.reads import Reads
from ltm.participant.recovery import Recovery
from ltm.participant.state import OutcomeQuery, Prepared, Settings

__all__ = [
    "Outcome",
    "OutcomeQuery",
    "Participant",
    "Prepared",
    "RowId",
    "Settings",
    "VoteNo",
]


class Participant(Recovery, Prepares, Decisions, Reads, Checkpoints):
    """One partition's LTM: each of its jobs is a base class in a module of its own, over the
    state they share (``PartitionState``); this class starts and stops it."""

    async def start(self) -> None:
        await self.recover()
        loop = asyncio.get_running_loop()
        self._background = [
            loop.create_task(self._checkpoint_loop()),
            loop.create_task(self._outcome_loop()),
        ]

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if not self.fenced:
            await self.checkpoint()
        # clean: every change is stored and nothing is undecided (no record is needed)
        await self.wal.close(clean=not (self.fenced or self.prepared or self.touched))
