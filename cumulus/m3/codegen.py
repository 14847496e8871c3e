"""M3 statements compiled once into straight-line Python, as DBToaster emits C++ for triggers.

A statement ``target[keys] += f1 * f2 * ...`` becomes the source of one function: its factors in
``plan_order``, each a line or a block (a guard an ``if``, a value term a test and a multiply, a
lift an assignment or an equality test, a lookup a ``dict.get``, a slice a ``for`` over an index
bucket), M3 variables as Python locals, and the emit of the product into the target's delta.
The source is ``compile()``d once (code objects are cached by source text) and run with
``exec`` in a namespace holding the maps, helpers and constants.

The semantics are the reference interpreter's, step for step: the same factor order, the same
arithmetic (``cumulus.expressions.add``/``mul``/``ARITHMETIC``, exact for INT and DECIMAL;
given the trigger's ``Typing``, INT with INT is Python's operator and INT or DECIMAL with a
DECIMAL the exact context's method, which is what those functions do for such operands, and a
value never NULL is not tested for NULL: ``cumulus.m3.value_kinds``), SQL NULLs (an operand
None makes a result None; a guard passes only TRUE; a NULL or zero value term skips the row; a
lift binds NULL), the accumulator multiplied factor by factor
from 1, each entry read counted. Variables, literals, ``+ - * /``, negation, ABS, EXTRACT and
SUBSTRING (calls of the evaluator's own functions, NULL on NULL), comparisons and ``IS NOT
NULL``, AND, OR, NOT (three-valued) and IN over constants are written inline; any other term
(CASE, COALESCE, GREATEST, LEAST, BETWEEN, LIKE, IN over expressions, or a guard containing one) is
evaluated as a whole by the interpreter's own closure (``compile_value`` / ``compile_guard``)
over a dict of the variables it reads: never a second evaluator of those.

How a map factor is read is the caller's (``Access``): the interpreter reads whole maps and
their secondary indexes (``cumulus.m3.interpreter``), a runtime writer the tables of entries it
was pushed (``cumulus.runtime.evaluate``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from types import CodeType
from typing import Any, Protocol

from cumulus.expressions import (
    ARITHMETIC,
    EXACT,
    STRICT,
    STRICT_FUNCTIONS,
    add,
    literal_value,
    mul,
    negate,
    substring_function,
)
from cumulus.m3.exprs import compile_guard, compile_value, extreme_of, is_predicate, vars_of
from cumulus.m3.order import plan_order, produced
from cumulus.m3.program import Expr, Factor, Guard, Lift, MapExtreme, MapLift, MapRef, Rel, Value
from cumulus.m3.value_kinds import UNKNOWN, Known, Typing

_COMPARE = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
INDENT = "    "
# INT with INT is Python's own operator (what ``add``, ``_sub`` and ``mul`` do for two ints);
# INT or DECIMAL with a DECIMAL the exact context's method (what they do then)
_NATIVE = {"+": "{} + {}", "-": "{} - {}", "*": "{} * {}"}
_EXACT = {"+": "_eadd({}, {})", "-": "_esub({}, {})", "*": "_emul({}, {})"}
_EXACT_NAMES = {"_eadd": EXACT.add, "_esub": EXACT.subtract, "_emul": EXACT.multiply}
_LITERAL_KINDS = {int: "INT", Decimal: "DECIMAL", float: "FLOAT", str: "TEXT", bool: "BOOL"}


class Access(Protocol):
    """How the generated code reads one map factor (at ``position`` in the statement body)."""

    def prologue(self, gen: Gen, position: int, factor: MapRef | Rel) -> None:
        """Lines at the function's top (fetching the factor's table once)."""

    def point(self, gen: Gen, position: int, key: str, value: str) -> None:
        """Lines binding ``value`` to the entry at ``key`` (a tuple expression) or None."""

    def scan(
        self, gen: Gen, position: int, bound: tuple[int, ...], values: list[str]
    ) -> tuple[str, str]:
        """Lines opening a ``for`` over the entries whose ``bound`` positions hold the locals
        ``values`` (at ``gen.depth``, the loop's body one deeper), binding each entry's full key
        and value to the names it returns."""


@dataclass
class Gen:
    """The source being written and the namespace it will run in."""

    lines: list[str] = field(default_factory=list)
    namespace: dict[str, Any] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # M3 variable -> local
    depth: int = 1
    fresh: Callable[[], int] = field(default_factory=lambda: itertools.count().__next__)
    in_loop: bool = False  # whether the line being written is inside a slice's loop
    counting: bool = True  # count each entry read in ``_counter[0]`` (the interpreter's measure)
    typing: Typing | None = None  # what the values may be assumed to be (None: nothing)
    known: dict[str, Known] = field(default_factory=dict)  # by code: its kind, never NULL

    def line(self, text: str) -> None:
        self.lines.append(INDENT * self.depth + text)

    def kind_of(self, code: str) -> Known:
        return self.known.get(code, UNKNOWN)

    def assume(self, code: str, known: Known) -> str:
        """Notes what ``code``'s value is (only where a typing is given) and returns it."""
        if self.typing is not None:
            self.known[code] = known
        return code

    def temp(self, stem: str = "t") -> str:
        return f"_{stem}{self.fresh()}"

    def const(self, value: Any, stem: str = "c") -> str:
        name = self.temp(stem)
        self.namespace[name] = value
        return self.assume(name, (_LITERAL_KINDS.get(type(value)), value is not None))

    def local(self, var: str) -> str:
        if var not in self.names:
            self.names[var] = f"v{len(self.names)}"
        return self.names[var]

    def key(self, variables: Sequence[str]) -> str:
        return tuple_code([self.local(v) for v in variables])


def tuple_code(names: Sequence[str]) -> str:
    """A tuple display of Python names (``()``, ``(a,)``, ``(a, b,)``)."""
    return "(" + "".join(n + ", " for n in names).rstrip(" ") + ")"


# --- expressions ---------------------------------------------------------------------------
#
# Each function returns a Python expression and, where the generator has a typing, notes what
# its value is (``Gen.assume``): an operand never NULL is not tested for NULL, INT arithmetic
# is Python's operators, and a three-valued predicate that cannot be NULL is a plain bool.


def _value_code(gen: Gen, expr: Expr) -> str | None:
    """A value term as a Python expression, None where it is not written inline."""
    if "var" in expr:
        return gen.local(expr["var"])
    if "lit" in expr:
        return gen.const(literal_value(expr))
    if "op" in expr and expr["op"] in ARITHMETIC and len(expr.get("args", ())) == 2:
        return _arithmetic(gen, expr["op"], expr["args"])
    if "neg" in expr:
        inner = _value_code(gen, expr["neg"])
        if inner is not None and gen.kind_of(inner)[0] == "INT":
            return _unary(gen, inner, "-{}", "INT")
        return _unary(gen, inner, gen.const(negate, "neg") + "({})", gen.kind_of(inner or "")[0])
    if expr.get("fn") in STRICT and isinstance(expr.get("args"), list):
        name = expr["fn"]
        apply = substring_function(expr) if name == "substring" else STRICT_FUNCTIONS[name]
        call = gen.const(apply, "fn") + "({})"
        return _unary(gen, _value_code(gen, expr["args"][0]), call, total=False)
    return None


def _arithmetic(gen: Gen, op: str, args: Sequence[Expr]) -> str | None:
    """``+ - * /`` as ``cumulus.expressions`` computes them, inline where the kinds allow."""
    codes = [_value_code(gen, a) for a in args]
    if None in codes:
        return None
    kinds = {gen.kind_of(code)[0] for code in codes if code is not None}
    if op in _NATIVE and kinds == {"INT"}:
        return _binary(gen, codes, "(" + _NATIVE[op] + ")", "INT")
    if op in _EXACT and _exact(kinds):
        return _binary(gen, codes, _EXACT[op], "DECIMAL")
    return _binary(gen, codes, gen.const(ARITHMETIC[op], "op") + "({}, {})", total=op != "/")


def _unary(
    gen: Gen, inner: str | None, template: str, kind: str | None = None, total: bool = True
) -> str | None:
    """NULL if the operand is, else ``template`` of it (None if the operand is not inline);
    with an operand never NULL, the result is not either if the operation is ``total``."""
    if inner is None:
        return None
    if gen.kind_of(inner)[1]:
        return gen.assume(f"({template.format(inner)})", (kind, total))
    t = gen.temp()
    return f"(None if ({t} := {inner}) is None else {template.format(t)})"


def _binary(
    gen: Gen,
    codes: Sequence[str | None],
    template: str,
    kind: str | None = None,
    total: bool = True,
) -> str | None:
    """NULL if either operand is (the right one is not evaluated when the left is NULL);
    ``kind`` is the result's, never NULL where no operand is and the operation is ``total``.
    An operand known never NULL is written in place, with no test."""
    if None in codes:
        return None
    names, tests = [], []
    for code in codes:
        assert code is not None
        if gen.kind_of(code)[1]:
            names.append(code)
        elif code.isidentifier():  # a local or a constant: read as it is
            names.append(code)
            if gen.namespace.get(code, None) is None:  # a constant (never NULL) needs no test
                tests.append(f"{code} is None")
        else:
            name = gen.temp()
            names.append(name)
            tests.append(f"({name} := {code}) is None")
    if not tests:  # parenthesized: ``1 == 1 is True`` would chain the comparisons
        return gen.assume(f"({template.format(*names)})", (kind, total))
    return f"(None if {' or '.join(tests)} else {template.format(*names)})"


def _guard_code(gen: Gen, pred: Expr) -> str:
    """A guard as a Python condition, True only where the predicate is TRUE."""
    if "notnull" in pred:
        inner = _value_code(gen, pred["notnull"])
        if inner is not None:
            return f"{inner} is not None"
    code = _predicate_code(gen, pred)
    if code is None:
        return _fallback(gen, compile_guard(pred), pred)
    return code if gen.kind_of(code)[1] else f"({code}) is True"


def _predicate_code(gen: Gen, pred: Expr) -> str | None:
    """A predicate as a three-valued Python expression (True, False, None for NULL), as
    ``cumulus.expressions`` evaluates it (AND and OR stop at their first deciding part); None
    where it is not written inline (BETWEEN, LIKE, IN over non-constants)."""
    if "cmp" in pred and pred["cmp"] in _COMPARE and len(pred.get("args", ())) == 2:
        codes = [_value_code(gen, a) for a in pred["args"]]
        return _binary(gen, codes, "{} " + _COMPARE[pred["cmp"]] + " {}", "BOOL")
    if "notnull" in pred:
        inner = _value_code(gen, pred["notnull"])
        return None if inner is None else gen.assume(f"({inner} is not None)", ("BOOL", True))
    if "not" in pred:
        return _unary(gen, _predicate_code(gen, pred["not"]), "not {}", "BOOL")
    for key, decisive in (("and", False), ("or", True)):
        if key in pred and isinstance(pred[key], list) and pred[key]:
            parts = [_predicate_code(gen, p) for p in pred[key]]
            return None if None in parts else _connective(gen, parts, decisive)
    if "in" in pred and isinstance(pred.get("values"), list) and pred["values"]:
        return _in_constants(gen, pred)
    return None


def _connective(gen: Gen, parts: list[str | None], decisive: bool) -> str:
    """``decisive`` if a part is (the rest not evaluated), else NULL if a part is NULL, else
    the other truth value."""
    if all(gen.kind_of(str(part))[1] for part in parts):  # two-valued: Python's own
        joined = (" or " if decisive else " and ").join(str(part) for part in parts)
        return gen.assume(f"({joined})", ("BOOL", True))
    temps = [gen.temp() for _ in parts]
    code = f"(None if {' or '.join(f'{t} is None' for t in temps)} else {not decisive})"
    for t, part in reversed(list(zip(temps, parts, strict=True))):
        code = f"({decisive} if ({t} := {part}) is {decisive} else {code})"
    return code


def _in_constants(gen: Gen, pred: Expr) -> str | None:
    """``x IN (constants)``: TRUE, FALSE, or NULL when x is NULL or the list holds a NULL."""
    values = pred["values"]
    subject = _value_code(gen, pred["in"])
    if subject is None or not all("lit" in v or "null" in v for v in values):
        return None
    constants = gen.const(frozenset(literal_value(v) for v in values if "lit" in v), "set")
    miss = None if any("null" in v for v in values) else False
    if miss is False and gen.kind_of(subject)[1]:
        return gen.assume(f"({subject} in {constants})", ("BOOL", True))
    t = gen.temp()
    return f"(None if ({t} := {subject}) is None else (({t} in {constants}) or {miss}))"


def _term_code(gen: Gen, expr: Expr) -> str:
    code = None if is_predicate(expr) else _value_code(gen, expr)
    return code if code is not None else _fallback(gen, compile_value(expr), expr)


def _fallback(gen: Gen, evaluate: Callable[[dict[str, Any]], Any], expr: Expr) -> str:
    """The interpreter's closure, over a dict of the variables the term reads."""
    env = ", ".join(f"{name!r}: {gen.local(name)}" for name in vars_of(expr))
    return f"{gen.const(evaluate, 'f')}({{{env}}})"


# --- statements ----------------------------------------------------------------------------


def write_product(
    gen: Gen,
    body: Sequence[Factor],
    args: Sequence[str],
    access: Access,
    emit: Callable[[Gen, str], None],
    where: str,
) -> None:
    """The product's nested blocks from ``gen.depth`` on; ``emit(gen, acc)`` writes the
    innermost line(s). ``gen.depth`` is back where it was afterwards."""
    start, gen.in_loop = gen.depth, False
    order = plan_order(body, set(args), where)
    positions = [next(i for i, f in enumerate(body) if f is factor) for factor in order]
    for position in positions:
        factor = body[position]
        if isinstance(factor, MapRef | Rel):
            access.prologue(gen, position, factor)
    bound, acc = set(args), "1"
    for position in positions:
        factor = body[position]
        acc = _factor(gen, position, factor, bound, acc, access)
        bound |= produced(factor)
    emit(gen, acc)
    gen.depth = start


def unpack(gen: Gen, args: Sequence[str], source: str) -> None:
    """The trigger's arguments as locals, from the tuple named ``source``."""
    if args:
        gen.line(f"{', '.join(gen.local(a) for a in args)}, = {source}")
    if gen.typing is not None:
        for arg, known in zip(args, gen.typing.args, strict=True):
            gen.assume(gen.local(arg), known)


def _factor(
    gen: Gen, position: int, factor: Factor, bound: set[str], acc: str, access: Access
) -> str:
    """Opens the factor's block; returns the accumulator's name after it."""
    if isinstance(factor, Guard):
        gen.line(f"if {_guard_code(gen, factor.pred)}:")
        gen.depth += 1
        return acc
    if isinstance(factor, Value):
        value = gen.temp("x")
        code = _term_code(gen, factor.expr)
        gen.line(f"{value} = {code}")
        known = gen.kind_of(code)
        gen.line(f"if {value} != 0:" if known[1] else f"if {value} is not None and {value} != 0:")
        gen.assume(value, (known[0], True))
        gen.depth += 1
        return _multiply(gen, acc, value)
    if isinstance(factor, Lift):
        return _bind(gen, factor.var, _term_code(gen, factor.expr), bound, acc)
    keys = factor.keys if isinstance(factor, MapRef) else factor.args
    if isinstance(factor, MapExtreme):  # a nested MIN or MAX: its slice's extreme value
        return _extreme(gen, position, factor, bound, acc, access)
    if isinstance(factor, MapLift):  # a nested aggregate's value: 0 where it has no entry
        value = gen.temp("x")
        access.point(gen, position, gen.key(keys), value)
        _count(gen)
        code = f"({value} if {value} is not None else 0)"  # an INT 0 whatever the map's kind
        gen.assume(code, ("INT" if _value_kind(gen, factor) == "INT" else None, True))
        return _bind(gen, factor.var, code, bound, acc)
    if all(k in bound for k in keys):
        value = gen.temp("x")
        access.point(gen, position, gen.key(keys), value)
        gen.line(f"if {value} is not None:")
        gen.assume(value, (_value_kind(gen, factor), True))
        gen.depth += 1
        _count(gen)
        return _multiply(gen, acc, value)
    return _slice(gen, position, factor, bound, acc, access)


def _value_kind(gen: Gen, factor: MapRef | Rel) -> str | None:
    return gen.typing.value(factor) if gen.typing is not None else None


def _extreme(
    gen: Gen, position: int, factor: MapExtreme, bound: set[str], acc: str, access: Access
) -> str:
    """The slice's entries gathered by the caller's scan, then ``extreme_of`` them, bound to
    the variable (or compared with it)."""
    prefix = tuple(range(len(factor.keys) - 1))
    entries = gen.temp("e")
    gen.line(f"{entries} = []")
    in_loop = gen.in_loop
    full, value = access.scan(gen, position, prefix, [gen.local(factor.keys[i]) for i in prefix])
    gen.line(f"{INDENT}{entries}.append(({full}, {value}))")
    gen.in_loop = in_loop
    adjusted = "None"
    if factor.adjust is not None:
        adjusted = f"({_term_code(gen, factor.adjust[0])}, {_term_code(gen, factor.adjust[1])})"
    call = f"{gen.const(extreme_of, 'ext')}({entries}, {factor.extreme!r}, {adjusted})"
    return _bind(gen, factor.var, call, bound, acc)


def _bind(gen: Gen, var: str, code: str, bound: set[str], acc: str) -> str:
    """A lift's line: ``var`` bound to ``code`` (NULL too), or compared with it if bound."""
    if var in bound:  # NULL is a key like any other (SQL's one NULL group)
        gen.line(f"if {code} == {gen.local(var)}:")
        gen.depth += 1
    else:
        gen.line(f"{gen.local(var)} = {code}")
        gen.assume(gen.local(var), gen.kind_of(code))
    return acc


def _slice(
    gen: Gen,
    position: int,
    factor: MapRef | Rel,
    bound: set[str],
    acc: str,
    access: Access,
) -> str:
    """A loop over the entries fitting the bound keys, binding the open ones in key order (a
    repeated open key binds at its first position and must be equal at the others)."""
    keys = factor.keys if isinstance(factor, MapRef) else factor.args
    positions = tuple(i for i, k in enumerate(keys) if k in bound)
    values = [gen.local(keys[i]) for i in positions]
    full, value = access.scan(gen, position, positions, values)
    gen.depth += 1
    gen.in_loop = True
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        if k in bound:
            continue
        if k in first:
            gen.line(f"if {full}[{i}] != {full}[{first[k]}]:")
            gen.line(INDENT + "continue")
        else:
            first[k] = i
    for k, i in first.items():
        gen.line(f"{gen.local(k)} = {full}[{i}]")
        if gen.typing is not None:
            gen.assume(gen.local(k), gen.typing.key(factor, i))
    gen.assume(value, (_value_kind(gen, factor), True))
    _count(gen)
    return _multiply(gen, acc, value)


def _count(gen: Gen) -> None:
    if gen.counting:
        gen.line("_counter[0] += 1")


def _multiply(gen: Gen, acc: str, value: str) -> str:
    """``acc * value`` as a new temporary; the first factor is taken as it is (1 times an int,
    a float or a Decimal is that value, of its type and exponent), not multiplied by 1."""
    if acc == "1":
        return value
    result = gen.temp("a")
    gen.line(f"{result} = {_exact_or_native(gen, '*', acc, value)}")
    kinds = {gen.kind_of(acc)[0], gen.kind_of(value)[0]}
    gen.assume(result, ("INT" if kinds == {"INT"} else "DECIMAL" if _exact(kinds) else None, True))
    return result


def _exact(kinds: set[str | None]) -> bool:
    return "DECIMAL" in kinds and kinds <= {"INT", "DECIMAL"}


def _exact_or_native(gen: Gen, op: str, a: str, b: str) -> str:
    """``a op b`` of two values never NULL, as ``add`` or ``mul`` computes it."""
    kinds = {gen.kind_of(a)[0], gen.kind_of(b)[0]}
    if kinds == {"INT"}:
        return _NATIVE[op].format(a, b)
    if _exact(kinds):
        return _EXACT[op].format(a, b)
    return f"{'_add' if op == '+' else '_mul'}({a}, {b})"


def accumulate(gen: Gen, out: str, key: str, acc: str) -> None:
    """``out[key] += acc``, the first delta for a key taken as it is (as the interpreter):
    every delta of one emit is of the accumulator's kind."""
    old = gen.temp("o")
    gen.assume(old, gen.kind_of(acc))
    gen.line(f"{old} = {out}.get({key})")
    gen.line(f"{out}[{key}] = {acc} if {old} is None else {_exact_or_native(gen, '+', old, acc)}")


def finish(gen: Gen, header: str, name: str) -> Callable[..., Any]:
    """Compiles the function (once per source text) and returns it from its namespace."""
    source = "\n".join([header, *(gen.lines or [INDENT + "pass"])])
    namespace = {**gen.namespace, "_add": add, "_mul": mul, **_EXACT_NAMES}
    exec(_code(source), namespace)
    function = namespace[name]
    function.source = source  # shown when a test or a person wants to see what runs
    return function


@functools.lru_cache(maxsize=4096)
def _code(source: str) -> CodeType:
    return compile(source, "<m3 statement>", "exec")


# --- the interpreter's triggers --------------------------------------------------------------


class Store(Protocol):
    """What a trigger reads of a map: its entries, and an index per bound-positions pattern."""

    data: dict[tuple[Any, ...], Any]

    def index(self, positions: tuple[int, ...]) -> dict[Any, dict[Any, None]]: ...

    def add(self, key: tuple[Any, ...], delta: Any) -> None: ...


@dataclass
class StoreAccess:
    """Whole maps (the interpreter's): a point is ``data.get``, a slice an index bucket."""

    store_of: Callable[[MapRef | Rel], Store]

    def prologue(self, gen: Gen, position: int, factor: MapRef | Rel) -> None:
        self._factors[position] = factor

    def __post_init__(self) -> None:
        self._factors: dict[int, MapRef | Rel] = {}

    def point(self, gen: Gen, position: int, key: str, value: str) -> None:
        data = gen.const(self.store_of(self._factors[position]).data, "d")
        gen.line(f"{value} = {data}.get({key})")

    def scan(
        self, gen: Gen, position: int, bound: tuple[int, ...], values: list[str]
    ) -> tuple[str, str]:
        store = self.store_of(self._factors[position])
        index, data = gen.const(store.index(bound), "ix"), gen.const(store.data, "d")
        full, value = gen.temp("k"), gen.temp("x")
        gen.line(f"for {full} in {index}.get({tuple_code(values)}, ()):")
        gen.line(f"{INDENT}{value} = {data}[{full}]")
        return full, value


@dataclass(frozen=True)
class TriggerStatement:
    """One statement as the trigger compiler needs it."""

    body: tuple[Factor, ...]
    target_keys: tuple[str, ...]
    target: Store
    where: str


def compile_trigger(
    args: Sequence[str],
    statements: Sequence[TriggerStatement],
    store_of: Callable[[MapRef | Rel], Store],
    counter: list[int],
    typing: Typing | None = None,
) -> Callable[[tuple[Any, ...]], None]:
    """``fire(values)``: every statement's delta computed from the maps as they were before the
    trigger, then each applied in statement order (``Store.add``: zeros vanish)."""
    gen = Gen(namespace={"_counter": counter}, typing=typing)
    parts = [(s.body, s.target_keys, s.where) for s in statements]
    outs = write_deltas(gen, args, parts, StoreAccess(store_of))
    for out, statement in zip(outs, statements, strict=True):
        apply = gen.const(statement.target.add, "apply")
        gen.line(f"for _key, _delta in {out}.items():")
        gen.line(f"{INDENT}{apply}(_key, _delta)")
    return finish(gen, "def fire(_values):", "fire")


def write_deltas(
    gen: Gen,
    args: Sequence[str],
    statements: Sequence[tuple[Sequence[Factor], tuple[str, ...], str]],
    access: Access,
) -> list[str]:
    """The trigger's arguments unpacked from ``_values``, then each statement (body, target
    keys, where) summed into a dict of its own, all from the same state: the dicts' names."""
    unpack(gen, args, "_values")
    outs = []
    for number, (body, keys, where) in enumerate(statements):
        out = f"_out{number}"
        gen.line(f"{out} = {{}}")

        def emit(gen: Gen, acc: str, out: str = out, keys: tuple[str, ...] = keys) -> None:
            accumulate(gen, out, gen.key(keys), acc)

        write_product(gen, body, args, access, emit, where)
        outs.append(out)
    return outs
