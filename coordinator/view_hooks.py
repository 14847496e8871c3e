"""What the transaction path calls on views (``TransactionManager.view_hooks``): the view
manager's maintenance (``coordinator.view_maintenance``) in a member with views, nothing
(``NO_VIEWS``) until one is attached."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aggview.wire import ltm_pb2 as lpb

if TYPE_CHECKING:
    from coordinator.commits import Transaction


class ViewHooks(Protocol):
    def capture(self, ops: list[lpb.RowOp]) -> None:
        """Before the first prepare: asks the LTMs to append change rows for the views that
        capture (async, cumulus, initializing)."""

    async def maintain(self, tx: Transaction, images: list[lpb.RowImage]) -> list[lpb.RowOp]:
        """After every round of yes votes: the index entries and sync view deltas the round's
        row images call for, prepared as another round (none: done)."""
        ...

    def watches(self, table_id: str) -> bool:
        """Whether writes to a store table need row images on their votes."""
        ...

    def lookup_tables(self) -> set[str]:
        """The store tables view maintenance looks up by primary key (cached)."""
        ...

    def committed(self, ts: int, images: list[lpb.RowImage]) -> None:
        """At the commit decision: the changes cumulus views read go to this member's
        switch (``coordinator.view_switches``)."""

    def unknown(self, ts: int, images: list[lpb.RowImage]) -> None:
        """The commit decision's write failed: the transaction may have committed (a
        restart or a takeover may deliver its record), so its changes cannot be sent."""


class NoViews:
    """No views: nothing captured, maintained, watched or looked up."""

    def capture(self, ops: list[lpb.RowOp]) -> None:
        pass

    async def maintain(self, tx: Transaction, images: list[lpb.RowImage]) -> list[lpb.RowOp]:
        return []

    def watches(self, table_id: str) -> bool:
        return False

    def lookup_tables(self) -> set[str]:
        return set()

    def committed(self, ts: int, images: list[lpb.RowImage]) -> None:
        pass

    def unknown(self, ts: int, images: list[lpb.RowImage]) -> None:
        pass


NO_VIEWS: ViewHooks = NoViews()
