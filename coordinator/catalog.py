"""The catalog: table schemas declared in SQL, persisted in the store's ``_catalog`` table.

Each table gets a fresh store table id (``t<N>_<name>``) at CREATE, so a table dropped and
created again never sees rows of its predecessor that an LTM or the store still holds.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

from sqlglot import exp

from aggview import errors
from aggview.schema import Column, ColumnType, TableSchema
from cumulus.sqltext import identifier
from ltm.store.base import Guard, Store

CATALOG_TABLE = "_catalog"
META_TABLE = "_meta"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def table_from_create(statement: exp.Create, table_id_for: callable) -> TableSchema:  # type: ignore[valid-type]
    schema = statement.this
    if not isinstance(schema, exp.Schema):
        raise errors.InvalidArgument("CREATE TABLE needs a column list")
    name = identifier(schema.this, "table")
    columns: list[Column] = []
    primary_key: list[str] = []
    for item in schema.expressions:
        if isinstance(item, exp.ColumnDef):
            column_name = identifier(item.this, "column")
            kind = item.args.get("kind")
            if kind is None:
                raise errors.InvalidArgument(f"column {name}.{column_name} has no type")
            nullable = True
            for constraint in item.constraints:
                ckind = constraint.args.get("kind")
                if isinstance(ckind, exp.NotNullColumnConstraint):
                    nullable = False
                elif isinstance(ckind, exp.PrimaryKeyColumnConstraint):
                    primary_key.append(column_name)
                else:
                    raise errors.InvalidArgument(
                        f"unsupported column constraint {constraint.sql()!r} "
                        f"on {name}.{column_name}"
                    )
            columns.append(Column(column_name, ColumnType.parse(kind.sql()), nullable))
        elif isinstance(item, exp.PrimaryKey):
            if primary_key:
                raise errors.InvalidArgument(f"table {name} declares its primary key twice")
            primary_key = [identifier(c, "column") for c in item.expressions]
        else:
            raise errors.InvalidArgument(f"unsupported table element {item.sql()!r} in {name}")
    if not primary_key:
        raise errors.InvalidArgument(f"table {name} needs a PRIMARY KEY")
    return TableSchema.build(name, table_id_for(name), columns, primary_key)


class Catalog:
    """Schemas by name, loaded once and written through to the store on every change."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        store.create_table(CATALOG_TABLE)
        store.create_table(META_TABLE)
        self.tables: dict[str, TableSchema] = {}
        self.by_id: dict[str, TableSchema] = {}  # store table id -> schema (images, votes)
        self.view_names: set[str] = set()  # kept by the view manager: one namespace for both
        # At the leader of a replicated cluster: its writes land only while it leads
        # (``coordinator.leadership``); None: unguarded.
        self.guard: Callable[[], Guard] | None = None
        self.reload()

    def reload(self) -> None:
        """The tables as the store has them (a member that takes the lead)."""
        schemas = [
            TableSchema.from_json(json.loads(value))
            for _, value in self.store.scan_prefix(CATALOG_TABLE, b"table:")
        ]
        self.tables = {schema.name: schema for schema in schemas}
        self.by_id = {schema.table_id: schema for schema in schemas}

    def entries(self, kind: str) -> list[dict[str, Any]]:
        """Persisted catalog entries of one kind ("view", "index")."""
        return [
            json.loads(v) for _, v in self.store.scan_prefix(CATALOG_TABLE, f"{kind}:".encode())
        ]

    def put_entry(self, kind: str, name: str, entry: dict[str, Any] | None) -> None:
        value = None if entry is None else json.dumps(entry).encode()
        self._write(CATALOG_TABLE, f"{kind}:{name}".encode(), value)

    def _write(self, table: str, key: bytes, value: bytes | None) -> None:
        if self.guard is None:
            self.store.write([(table, key, value)])
        else:
            self.store.write_guarded(self.guard(), [(table, key, value)])

    def next_number(self) -> int:
        """A number never handed out before, for the store ids of tables, views and indexes."""
        number = int(self.meta("next_table_number") or "1")
        self.set_meta("next_table_number", str(number + 1))
        return number

    def first_epoch(self) -> int:
        """Where the catalog epochs of a member that starts leading begin: above every epoch
        an earlier leader published (a count of leaders' starts, kept in the store, times
        2**32). A follower outlives a leader's restart with the old leader's configurations
        in mind (caches keyed by epoch); were the new leader to count from 0 again, its
        epoch n would name another configuration than the one the follower knows as n (it
        did: a follower kept a table unwatched and committed writes without their sync view
        deltas)."""
        starts = int(self.meta("leader_starts") or "0") + 1
        self.set_meta("leader_starts", str(starts))
        return starts << 32

    def table(self, name: str) -> TableSchema:
        schema = self.tables.get(name)
        if schema is None:
            raise errors.UnknownTable(f"unknown table {name!r}")
        return schema

    def meta(self, key: str) -> str | None:
        value = self.store.get(META_TABLE, key.encode())
        return None if value is None else value.decode()

    def set_meta(self, key: str, value: str) -> None:
        self._write(META_TABLE, key.encode(), value.encode())

    def _next_table_id(self, name: str) -> str:
        return f"t{self.next_number()}_{name}"

    def create_table(self, statement: exp.Create) -> tuple[TableSchema | None, str]:
        """Returns the new schema (None if it existed and IF NOT EXISTS was given)."""
        with self._lock:
            schema = table_from_create(statement, lambda name: "pending")
            if schema.name in self.view_names:
                raise errors.AlreadyExists(f"{schema.name} is already the name of a view")
            if schema.name in self.tables:
                if statement.args.get("exists"):
                    return None, f"table {schema.name} already exists"
                raise errors.AlreadyExists(f"table {schema.name} already exists")
            schema = TableSchema.from_json(
                {**schema.to_json(), "table_id": self._next_table_id(schema.name)}
            )
            self.store.create_table(schema.table_id)
            self.put_entry("table", schema.name, schema.to_json())
            self.tables[schema.name] = schema
            self.by_id[schema.table_id] = schema
            return schema, f"created table {schema.name}"

    def drop_table(self, name: str, if_exists: bool) -> TableSchema | None:
        with self._lock:
            schema = self.tables.get(name)
            if schema is None:
                if if_exists:
                    return None
                raise errors.UnknownTable(f"unknown table {name!r}")
            self.put_entry("table", name, None)
            del self.tables[name]
            del self.by_id[schema.table_id]
            return schema
