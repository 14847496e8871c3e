"""The compiler's promises beyond equality with recomputation (tests/test_m3_differential.py):
higher-order maintenance really happens (no statement scans a relation, and per-update work does
not grow with the tables), ``--depth`` bounds it, maps are shared, factorization makes products
of maps, the aggregates read as the view path reads them, refusals name the construct, and the
``aggview m3`` command prints the program."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlglot

from aggcli.cli import main
from aggview import errors
from aggview.schema import TableSchema
from coordinator.catalog import table_from_create
from cumulus.aggregates import Kind
from cumulus.m3.canonical import canonical
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.parser import parse_program
from cumulus.m3.printer import print_program
from cumulus.m3.program import AggSum, MapRef, Program, Rel
from cumulus.runtime.placement import Placement

TABLES = [
    "CREATE TABLE customer (custkey INT PRIMARY KEY, name TEXT, nationkey INT, "
    "acctbal DECIMAL(12,2))",
    "CREATE TABLE lineitem (ordkey INT NOT NULL, extprice DECIMAL(12,2) NOT NULL, "
    "PRIMARY KEY (ordkey, extprice))",
    "CREATE TABLE orders (custkey INT NOT NULL, ordkey INT PRIMARY KEY, sprior INT)",
    "CREATE TABLE t (id INT PRIMARY KEY, g TEXT, v DECIMAL(8,2), x INT)",
]
Q3 = (
    "SELECT l.ordkey, o.sprior, SUM(l.extprice) FROM customer c, orders o, lineitem l "
    "WHERE c.custkey = o.custkey AND l.ordkey = o.ordkey GROUP BY l.ordkey, o.sprior"
)
SCHEMAS: dict[str, TableSchema] = {
    s.name: s for s in (table_from_create(sqlglot.parse_one(d), lambda n: n) for d in TABLES)
}


def compiled(*selects: str, depth: int | None = None) -> Program:
    names = ["q"] if len(selects) == 1 else [f"q{i}" for i in range(1, len(selects) + 1)]
    plans = [
        plan_of(sql, name, SCHEMAS.__getitem__) for sql, name in zip(selects, names, strict=True)
    ]
    return compile_program(plans, SCHEMAS.__getitem__, depth)


def relation_reads(program: Program) -> int:
    return sum(isinstance(f, Rel) for _, s in program.statements() for f in s.body)


def _work_per_update(program: Program, lineitems: int) -> float:
    """Map entries read per update by 30 probe updates (a delete and a re-insert of existing
    rows of each table), after loading 50 customers, 200 orders and ``lineitems`` lineitems in
    random order. Only the lineitems grow."""
    rng = random.Random(7)
    customers = [(c, "c", 1, Decimal("1.00")) for c in range(50)]
    orders = [(rng.randrange(50), o, rng.randrange(5)) for o in range(200)]
    items = [(rng.randrange(200), Decimal(i) / 100) for i in range(lineitems)]
    rows = [("customer", r) for r in customers] + [("orders", r) for r in orders]
    rows += [("lineitem", r) for r in items]
    rng.shuffle(rows)
    interp = Interpreter(program)
    for table, row in rows:
        interp.insert(table, row)
    probes = [("customer", customers[i]) for i in range(0, 50, 5)]
    probes += [("orders", orders[i]) for i in range(0, 200, 20)]
    probes += [("lineitem", items[i]) for i in range(0, 10)]
    before = interp.counter[0]
    for table, row in probes:
        interp.delete(table, row)
        interp.insert(table, row)
    return (interp.counter[0] - before) / (2 * len(probes))


def test_full_program_reads_no_relation_and_its_work_per_update_does_not_grow() -> None:
    full, first_order = compiled(Q3), compiled(Q3, depth=1)
    assert relation_reads(full) == 0
    assert relation_reads(first_order) > 0
    small, big = _work_per_update(full, 10**3), _work_per_update(full, 10**5)
    assert big <= 1.2 * small + 1, (small, big)
    # first-order IVM joins the relations on every update: its work grows with them
    small1, big1 = _work_per_update(first_order, 10**3), _work_per_update(first_order, 10**5)
    assert big1 > 20 * small1, (small1, big1)


def test_depth_bounds_the_recursion() -> None:
    zero, one, two, full = (compiled(Q3, depth=d) for d in (0, 1, 2, None))
    assert zero.maps == () and all(not t.statements for t in zero.triggers)
    assert isinstance(zero.views[0].rows, AggSum)
    assert {m.name for m in one.maps} == {"q_rows", "q_sum_extprice"}
    assert 2 < len(two.maps) < len(full.maps) == 9
    with pytest.raises(errors.InvalidArgument, match="--depth must be 0 or more"):
        compiled(Q3, depth=-1)


def test_factorization_makes_a_product_of_two_maps_not_one_map_of_degree_two() -> None:
    """Seed 003 line 15: on an order, Customer and Lineitem share no variable, so the delta is
    m_co[ok] * m_o[ck], two maps of degree 1."""
    program = compiled(Q3)
    trigger = program.trigger("+", "orders")
    assert trigger is not None
    target = next(s for s in trigger.statements if s.target.name == "q_sum_extprice")
    maps = [f for f in target.body if isinstance(f, MapRef)]
    assert len(maps) == 2
    degrees = [sum(isinstance(f, Rel) for f in program.map(m.name).definition.body) for m in maps]  # type: ignore[union-attr]
    assert degrees == [1, 1]


def test_maps_are_shared_within_a_view_and_across_views() -> None:
    counts = "SELECT o.sprior, COUNT(*) FROM orders o JOIN lineitem l ON l.ordkey = o.ordkey "
    sums = "SELECT o.sprior, SUM(l.extprice) FROM orders o JOIN lineitem l ON l.ordkey = o.ordkey "
    both = compiled(counts + "GROUP BY o.sprior", sums + "GROUP BY o.sprior")
    alone = [compiled(counts + "GROUP BY o.sprior"), compiled(sums + "GROUP BY o.sprior")]
    assert len(both.maps) < sum(len(p.maps) for p in alone)
    for program in [both, *alone, compiled(Q3)]:
        texts = [canonical(m.definition).text for m in program.maps if m.definition]
        assert len(texts) == len(set(texts))  # no two equivalent maps
    # SUM of a NOT NULL column counts its rows with the COUNT(*) map itself
    view = both.views[1]
    total = next(c for c in view.columns if c.kind is Kind.SUM)
    assert total.count == view.rows


def test_min_max_distinct_avg_and_having_read_like_the_view_path() -> None:
    program = compiled(
        "SELECT g, MIN(v) AS lo, MAX(v) AS hi, COUNT(DISTINCT x) AS xs, AVG(v) AS mean, "
        "SUM(v) AS total FROM t GROUP BY g HAVING COUNT(*) > 1"
    )
    interp = Interpreter(program)
    rows = [
        (1, "a", Decimal("1.00"), 5),
        (2, "a", Decimal("2.00"), 5),
        (3, "a", Decimal("3.00"), None),
        (4, "b", Decimal("9.00"), 1),
    ]
    for row in rows:
        interp.insert("t", row)
    assert interp.view("q") == [
        {
            "g": "a",
            "lo": Decimal("1.00"),
            "hi": Decimal("3.00"),
            "xs": 1,
            "mean": Decimal("2.000000"),
            "total": Decimal("6.00"),
        }
    ]  # group b has one row: HAVING hides it
    interp.delete("t", rows[0])  # the minimum goes: no rescan, the count map knows the next
    interp.insert("t", (5, "b", None, 2))
    got = {r["g"]: r for r in interp.view("q")}
    assert got["a"]["lo"] == Decimal("2.00") and got["a"]["mean"] == Decimal("2.500000")
    assert got["b"]["lo"] == got["b"]["hi"] == Decimal("9.00") and got["b"]["xs"] == 2
    interp.delete("t", rows[3])  # b is down to one row (with a NULL v): HAVING hides it
    assert [r["g"] for r in interp.view("q")] == ["a"]


@pytest.mark.parametrize(
    ("select", "named"),
    [
        ("SELECT COUNT(*) FROM t WHERE g ILIKE 'a%'", "ILIKE"),
        (
            "SELECT SUM(s.n) FROM orders o LEFT JOIN (SELECT c.custkey, COUNT(*) AS n "
            "FROM customer c GROUP BY c.custkey) s ON o.custkey = s.custkey AND o.ordkey = s.n",
            "a LEFT JOIN with a subquery other than a grouped one on exactly its group columns "
            "is maintained in refresh = 'sync' or 'async'",
        ),
        (
            "SELECT COUNT(*) FROM t WHERE x > (SELECT COUNT(DISTINCT x) FROM t)",
            "a COUNT\\(DISTINCT \\.\\.\\.\\) subquery is maintained in refresh = 'sync' or",
        ),
        (
            "SELECT COUNT(*) FROM orders o FULL JOIN customer c ON o.custkey < c.custkey",
            "a FULL JOIN's ON other than equalities",
        ),
        ("SELECT g FROM t GROUP BY g HAVING g > 'a'", "HAVING without an aggregate"),
    ],
)
def test_what_the_view_compiler_refuses_stays_refused(select: str, named: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=named):
        compiled(select)


def test_the_m3_command_prints_the_program(tmp_path: Path, capsys: Any) -> None:
    schema = tmp_path / "schema.sql"
    schema.write_text(";\n".join(TABLES) + ";\n")
    main(["m3", "--schema", str(schema), Q3])
    full = capsys.readouterr().out
    assert parse_program(full) == compiled(Q3)
    main(["m3", "--schema", str(schema), Q3, "--depth", "1"])
    first = parse_program(capsys.readouterr().out)
    assert relation_reads(first) > 0 and len(first.maps) == 2
    schema.write_text("CREATE TABLE a (id INT PRIMARY KEY);\nDROP TABLE a;\n")
    with pytest.raises(SystemExit) as exited:
        main(["m3", "--schema", str(schema), "SELECT COUNT(*) FROM a"])
    assert exited.value.code == 2
    assert "the schema holds CREATE TABLE statements only" in capsys.readouterr().err


def test_a_theta_join_is_a_guard_and_a_cross_product_a_product_of_maps() -> None:
    """The band join's delta loops over the other table's rows counted by the one column the
    guard reads (seed 003's m_o with a mixed condition); a cross product's delta multiplies
    the group's map by a map with no key (the other table's count or sum)."""
    band = compiled(
        "SELECT c.name, COUNT(*) AS n FROM customer c JOIN orders o "
        "ON o.custkey BETWEEN c.custkey - 2 AND c.custkey + 2 GROUP BY c.name"
    )
    assert [m.name for m in band.maps] == ["q_rows", "q_rows_customer", "q_rows_orders"]
    assert len(list(band.statements())) == 8
    text = print_program(band)
    assert (
        "q_rows(int)[][name] += q_rows_customer(int)[][custkey_o] * "
        "{custkey_o BETWEEN custkey - 2 AND custkey + 2};"
    ) in text
    assert "DECLARE MAP q_rows_customer(int)[][custkey_o:int] :=" in text
    cross = compiled(
        "SELECT c.name, SUM(o.sprior) AS s FROM customer c CROSS JOIN orders o GROUP BY c.name"
    )
    text = print_program(cross)
    assert "DECLARE MAP q_rows_customer(int)[][] :=" in text
    assert "q_s(int)[][name] += q_s_customer(int)[][];" in text
    assert relation_reads(band) == relation_reads(cross) == 0  # no statement scans a relation
    assert parse_program(text) == cross


def test_relations_joined_on_their_whole_key_are_replicated_tables() -> None:
    """A relation every FROM joins on its whole primary key (a dimension) is a ``CREATE
    TABLE``, and the maps only its triggers write are kept on every node (unless every read
    finds one in place partitioned); a relation some FROM
    reads otherwise (alone, or by a column that is not its key) stays a stream."""
    program = compiled(Q3)
    assert {s.name: s.replicated for s in program.sources} == {
        "customer": True,
        "orders": True,
        "lineitem": False,  # joined on ordkey, half of its key
    }
    text = print_program(program)
    assert "CREATE TABLE customer(" in text and "CREATE STREAM lineitem(" in text
    assert print_program(parse_program(text)) == text
    placement = Placement(program, 2)
    written_by: dict[str, set[str]] = {}
    for trigger, statement in program.statements():
        written_by.setdefault(statement.target.name, set()).add(trigger.relation)
    dimensions_only = {name for name, by in written_by.items() if by <= {"customer", "orders"}}
    assert placement.replicated and placement.replicated <= dimensions_only
    # the one left partitioned is read only where partitioning puts it anyway: the line
    # items read it at their order's key (``Placement``, ``_kinds``)
    assert dimensions_only - placement.replicated == {"q_rows_lineitem"}
    assert Placement(program, 1).replicated == set()
    also_alone = compiled(Q3, "SELECT o.sprior, COUNT(*) FROM orders o GROUP BY o.sprior")
    assert not also_alone.source("orders").replicated
    assert also_alone.source("customer").replicated
    self_join = compiled("SELECT a.g, SUM(b.v) FROM t a JOIN t b ON a.x = b.id GROUP BY a.g")
    assert not self_join.source("t").replicated  # alias a is not joined on its key
