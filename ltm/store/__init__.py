"""Store adapters behind one interface, chosen by URL scheme."""

from __future__ import annotations

from collections.abc import Callable

from aggview.errors import InvalidArgument
from ltm.store.base import Mutation, Store
from ltm.store.sqlite import SqliteStore

__all__ = ["Mutation", "SqliteStore", "Store", "open_store"]


def _open_sqlite(url: str) -> Store:
    # sqlite:///abs/path.db -> /abs/path.db; sqlite:///:memory: -> :memory:
    path = url[len("sqlite://") :]
    if path == "/:memory:":
        return SqliteStore(":memory:")
    if not path.startswith("/") or path == "/":
        raise InvalidArgument(
            "sqlite store URL must be sqlite:///absolute/path.db or sqlite:///:memory:; "
            f"got {url!r}"
        )
    return SqliteStore(path)


def _open_hbase(url: str) -> Store:
    # imported here so happybase loads only when an hbase:// URL is used
    from ltm.store.hbase import HBaseStore

    return HBaseStore.from_url(url)


_FACTORIES: dict[str, Callable[[str], Store]] = {
    "sqlite": _open_sqlite,
    "hbase": _open_hbase,
}


def open_store(url: str) -> Store:
    """Open the store a URL names: ``sqlite:///path`` (embedded) or ``hbase://host:port``
    (HBase's Thrift server; options in :meth:`ltm.store.hbase.HBaseStore.from_url`)."""
    scheme, sep, _ = url.partition("://") if isinstance(url, str) else ("", "", "")
    factory = _FACTORIES.get(scheme.lower()) if sep else None
    if factory is None:
        schemes = ", ".join(f"{s}://" for s in _FACTORIES)
        raise InvalidArgument(f"unsupported store URL {url!r}; supported schemes: {schemes}")
    return factory(url)
