"""Failover: when an LTM stops answering for good, its partitions move to their standbys.

The coordinator probes every LTM that serves a partition. One silent for ``after`` seconds is
taken for dead: for each partition it served, a new epoch is recorded in the store with the
in-sync standby as owner, the standby is told to take the partition over (it recovers it from
the store plus its copy of the log), and the partition's channel points there. Transactions
caught mid-way abort (their votes never came) or are re-delivered their commit (the decision
log keeps it). A partition whose standby is not in sync is not moved: it waits for its LTM."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from aggview.net import GRPC_OPTIONS
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc
from coordinator.ltm_channel import LtmChannel
from ltm.store import ownership
from ltm.store.base import Store

log = logging.getLogger(__name__)

PROBE_EVERY = 0.2
PROBE_TIMEOUT = 1.0  # a busy LTM may answer slowly; a dead one refuses at once


class Failover:
    def __init__(
        self,
        channels: list[LtmChannel],
        store: Store,
        addresses: list[str],
        tls: TlsDir | None,
        after: float,
    ) -> None:
        self.channels = channels
        self.store = store
        self.addresses = addresses
        self.after = after
        self._metadata = member_metadata(tls)
        self._channels = [member_channel(a, tls, GRPC_OPTIONS) for a in addresses]
        self._stubs = [pb_grpc.LtmStub(channel) for channel in self._channels]
        self._down_since: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._stuck: set[int] = set()  # partitions already reported as waiting for their LTM
        self.failovers = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for channel in self._channels:
            await channel.close()

    async def _alive(self, ltm: int) -> bool:
        try:
            await self._stubs[ltm].Status(
                pb.StatusRequest(), timeout=PROBE_TIMEOUT, metadata=self._metadata
            )
        except grpc.aio.AioRpcError:
            return False
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(PROBE_EVERY)
            owners = sorted({channel.owner for channel in self.channels})
            alive = await asyncio.gather(*(self._alive(ltm) for ltm in owners))
            now = time.monotonic()
            for ltm, up in zip(owners, alive, strict=True):
                if up:
                    self._down_since.pop(ltm, None)
                    continue
                since = self._down_since.setdefault(ltm, now)
                if now - since < self.after:
                    continue
                for channel in self.channels:
                    if channel.owner == ltm:
                        try:
                            await self.fail_over(channel)
                        except Exception:
                            log.exception("failover of partition %d failed", channel.index)

    async def fail_over(self, channel: LtmChannel) -> bool:
        partition = channel.index
        record = await asyncio.to_thread(ownership.read, self.store, partition)
        target = record.failover_target
        if target is None or target == record.owner:
            if partition not in self._stuck:
                self._stuck.add(partition)
                log.warning(
                    "LTM %d is down and partition %d has no in-sync standby: waiting for it",
                    record.owner,
                    partition,
                )
            return False
        self._stuck.discard(partition)
        moved = ownership.Ownership(
            partition,
            record.epoch + 1,
            target,
            standby=record.owner,  # resynced when it comes back
            standby_address=self.addresses[record.owner],
        )
        await asyncio.to_thread(ownership.write, self.store, moved)
        log.warning(
            "partition %d: LTM %d is down, LTM %d takes over at epoch %d",
            partition,
            record.owner,
            target,
            moved.epoch,
        )
        # The channel moves even if the call fails: the standby serves the partition on its
        # next start anyway, since the record names it.
        await channel.retarget(self.addresses[target], target, moved.epoch)
        self._down_since.pop(target, None)
        await self._stubs[target].TakeOver(
            pb.TakeOverRequest(
                partition=partition,
                epoch=moved.epoch,
                backup=record.owner,
                backup_address=self.addresses[record.owner],
            ),
            timeout=120,
            metadata=self._metadata,
        )
        self.failovers += 1
        return True
