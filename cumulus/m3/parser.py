"""DBToaster's M3 text -> ``Program``: the printer's output and hand-written programs (the
seeds' examples). Every error names the line and column where the text goes wrong.

Grammar (keywords in any case; ``--`` starts a comment, so the section banners are comments)::

    program   := (source | map | query | view | trigger)*
    source    := CREATE (STREAM|TABLE) name '(' name type [NOT NULL], ... ')' ';'
    map       := DECLARE MAP name '(' type ')' '[' ']' '[' name ':' type, ... ']' [':=' aggsum] ';'
    query     := DECLARE QUERY name ':=' part ';'
    view      := DECLARE VIEW name '[' name ':' type, ... ']' ':=' ROWS part (',' column)*
                 [HAVING '{' pred '}'] ';'
    column    := name | [HIDDEN] name ':=' KIND '(' part ('+' part)* [',' part] ')' ':' type
               | [HIDDEN] name ':=' '{' pred '}' ':' type     (derived: over the other columns)
    trigger   := ON ('+'|'-') name '(' name, ... ')' '{' (mapref '+=' product ';')* '}'
    part      := mapref | aggsum | '(' part ('+' part)* ')'
    aggsum    := AggSum '(' '[' name, ... ']' ',' product ')'
    product   := factor ('*' factor)*
    factor    := number | string | DATE '(' string ')' | TRUE | FALSE | name | '-' factor
               | mapref | name '(' name, ... ')' | '{' pred '}' | '(' name '^=' factor ')'
               | '(' product ')'
    mapref    := name ['(' type ')'] '[' ']' '[' name, ... ']'
    pred      := SQL's: OR, AND, NOT, comparisons, IN (...), BETWEEN, IS NOT NULL, LIKE 'p',
                 + - * /, literals, NULL, names, CAST(CASE WHEN p THEN e ... [ELSE e] END AS
                 type), CAST(COALESCE(e, ...) AS type), CAST(GREATEST(e, ...) AS type),
                 CAST(LEAST(e, ...) AS type) (with their type), ABS(e), EXTRACT(YEAR|MONTH|DAY
                 FROM e), SUBSTRING(e, start[, length]) (constants: start >= 1, length >= 0) and
                 CAST(SUM(s, n) AS type), CAST(AVG(s, n) AS type) (a nested aggregate
                 finished from its sum and count: NULL where n is 0)
"""

from __future__ import annotations

from aggview.schema import Column, ColumnType
from cumulus.aggregates import RULES, Kind
from cumulus.m3.exprs import MINUS_ONE, is_predicate, vars_of
from cumulus.m3.predicates import PredicateParser
from cumulus.m3.program import (
    VIEW_KINDS,
    AggSum,
    Factor,
    Guard,
    Lift,
    MapDecl,
    MapExtreme,
    MapLift,
    MapRef,
    Part,
    PartSum,
    Program,
    Query,
    Rel,
    Source,
    Statement,
    Trigger,
    Value,
    View,
    ViewColumn,
    lift_keys,
)
from cumulus.m3.tokens import Token
from cumulus.sqltext import negated_literal
from cumulus.typerules import NUMERIC


class _Parser(PredicateParser):
    """The statements of a program; the predicates inside braces are PredicateParser's."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.sources: dict[str, Source] = {}
        self.maps: dict[str, MapDecl] = {}
        self.queries: list[Query] = []
        self.views: list[View] = []
        self.triggers: list[Trigger] = []

    # --- program ---------------------------------------------------------------------------------

    def program(self) -> Program:
        while self.peek().kind != "end":
            if self.is_word("CREATE"):
                self.source()
            elif self.is_word("DECLARE") and self.is_word("MAP", 1):
                self.map_decl()
            elif self.is_word("DECLARE") and self.is_word("QUERY", 1):
                self.query()
            elif self.is_word("DECLARE") and self.is_word("VIEW", 1):
                self.view()
            elif self.is_word("ON"):
                self.trigger()
            else:
                raise self.fail(
                    f"expected CREATE STREAM, DECLARE MAP, DECLARE QUERY, DECLARE VIEW or ON, "
                    f"found {self.peek().shown()}"
                )
        return Program(
            tuple(self.sources.values()),
            tuple(self.maps.values()),
            tuple(self.queries),
            tuple(self.views),
            tuple(self.triggers),
        )

    def source(self) -> None:
        self.take()
        if not (self.is_word("STREAM") or self.is_word("TABLE")):
            raise self.fail(f"expected STREAM or TABLE, found {self.peek().shown()}")
        replicated = self.is_word("TABLE")
        self.take()
        relation, token = self.name("a relation name")
        if relation in self.sources:
            raise self.fail(f"relation {relation} is declared twice", token)
        self.op("(")
        columns: list[Column] = []
        while not self.accept_op(")"):
            if columns:
                self.op(",", " or ')'")
            column, column_token = self.name("a column name")
            if column in [c.name for c in columns]:
                raise self.fail(f"column {column} is declared twice", column_token)
            column_type = self.type()
            nullable = True
            if self.is_word("NOT"):
                self.take()
                self.word("NULL")
                nullable = False
            columns.append(Column(column, column_type, nullable))
        if not columns:
            raise self.fail(f"relation {relation} has no columns", token)
        self.op(";")
        self.sources[relation] = Source(relation, tuple(columns), replicated)

    def map_decl(self) -> None:
        self.pos += 2
        map_name, token = self.name("a map name")
        if map_name in self.maps or map_name in self.sources:
            raise self.fail(f"{map_name} is declared twice", token)
        self.op("(")
        value_type = self.type()
        self.op(")")
        self.op("[")
        self.op("]", " (input keys are not supported)")
        self.op("[")
        keys = self.typed_names("a key name")
        definition = None
        # the declaration first, so a definition's own name is known (and refused) below
        self.maps[map_name] = MapDecl(map_name, value_type, tuple(keys))
        if self.accept_op(":="):
            start = self.peek()
            definition = self.aggsum(relations_only=True)
            if list(definition.keys) != [k for k, _ in keys]:
                raise self.fail(
                    f"the definition of {map_name} sums over [{', '.join(definition.keys)}], "
                    f"not over its keys [{', '.join(k for k, _ in keys)}]",
                    start,
                )
        self.op(";")
        self.maps[map_name] = MapDecl(map_name, value_type, tuple(keys), definition)

    def typed_names(self, what: str) -> list[tuple[str, ColumnType]]:
        """``name: type, ... ]`` after a '[': a map's keys and a view's group keys alike."""
        keys: list[tuple[str, ColumnType]] = []
        while not self.accept_op("]"):
            if keys:
                self.op(",", " or ']'")
            key, _ = self.name(what)
            self.op(":")
            keys.append((key, self.type()))
        return keys

    def query(self) -> None:
        self.pos += 2
        query_name, _ = self.name("a query name")
        self.op(":=")
        part = self.part()
        self.op(";")
        self.queries.append(Query(query_name, part))

    def part(self) -> Part:
        if self.accept_op("("):  # a union's branches: (p1 + p2 + ...)
            parts = [self.single_part()]
            while self.accept_op("+"):
                parts.append(self.single_part())
            self.op(")")
            return PartSum(tuple(parts))
        return self.single_part()

    def single_part(self) -> MapRef | AggSum:
        if self.is_word("AGGSUM"):
            return self.aggsum(relations_only=False)
        start = self.peek()
        factor = self.factor()
        if len(factor) != 1 or not isinstance(factor[0], MapRef):
            raise self.fail("expected a map or AggSum(...)", start)
        return factor[0]

    def aggsum(self, relations_only: bool) -> AggSum:
        start = self.word("AGGSUM")
        self.op("(")
        self.op("[")
        keys = [k for k, _ in self.names("]", "a variable")]
        self.op(",")
        body = self.product(set(), relations_only=relations_only)
        self.op(")")
        bound = self.bound_by(body, set())
        self.check_bound(keys, bound, start)
        return AggSum(tuple(keys), tuple(body))

    def view(self) -> None:
        self.pos += 2
        view_name, _ = self.name("a view name")
        self.op("[")
        keys = self.typed_names("a group key")
        key_names = {k for k, _ in keys}
        self.op(":=")
        self.word("ROWS")
        rows = self.view_part(key_names, extra=0)
        columns: list[ViewColumn] = []
        starts: list[Token] = []
        while self.accept_op(","):
            start = self.peek()
            columns.append(self.view_column(key_names))
            starts.append(start)
        known = key_names | {c.name for c in columns if c.kind is not None}
        for column, start in zip(columns, starts, strict=True):
            unknown = [v for v in vars_of(column.expr or {}) if v not in known]
            if unknown:
                raise self.fail(f"{column.name} reads {unknown[0]}: not a view column", start)
        having = None
        if self.is_word("HAVING"):
            token = self.take()
            self.op("{")
            having = self.pred()
            self.op("}")
            known = key_names | {c.name for c in columns}
            unknown = [v for v in vars_of(having) if v not in known]
            if unknown:
                raise self.fail(f"HAVING reads {unknown[0]}, which is not a view column", token)
        self.op(";")
        if not columns:
            raise self.fail(f"view {view_name} has no columns")
        self.views.append(View(view_name, tuple(keys), rows, tuple(columns), having))

    def view_column(self, keys: set[str]) -> ViewColumn:
        hidden = self.is_word("HIDDEN") and self.peek(1).kind in ("word", "name")
        if hidden:
            self.take()
        column, token = self.name("a view column")
        if not self.accept_op(":="):
            if hidden or column not in keys:
                raise self.fail(f"{column} is not a group key of the view", token)
            return ViewColumn(column)
        if self.accept_op("{"):  # derived: an expression over the columns before it
            expr = self.pred()
            self.op("}")
            self.op(":")
            return ViewColumn(column, None, (), None, self.type(), hidden, expr)
        kind_token = self.take()
        names = [k.name for k in VIEW_KINDS]
        if kind_token.kind != "word" or kind_token.text.upper() not in names:
            raise self.fail(f"expected one of {', '.join(names)}", kind_token)
        kind = Kind[kind_token.text.upper()]
        rule = RULES[kind]
        self.op("(")
        parts = [self.view_part(keys, 1 if rule.keeps_values else 0, hidden)]
        while rule.keeps_sum and self.accept_op("+"):
            parts.append(self.view_part(keys, 0, hidden))
        count = None
        if rule.keeps_sum:
            self.op(",", f" and the count {kind.name} reads")
            count = self.view_part(keys, 0, hidden)
        self.op(")")
        self.op(":")
        return ViewColumn(column, kind, tuple(parts), count, self.type(), hidden)

    def view_part(self, keys: set[str], extra: int, hidden: bool = False) -> Part:
        """A part a view column reads: by every group key (and a count map's value); a hidden
        column's (a scalar subquery's HAVING reads) may read by none, the same in each group."""
        start = self.peek()
        part = self.part()
        used = part.keys
        if hidden and not set(used) & keys and len(used) == extra:
            return part
        if not keys <= set(used) or len([k for k in used if k not in keys]) != extra:
            want = "all group keys and one value variable" if extra else "the group keys only"
            raise self.fail(f"a view reads maps by {want}", start)
        return part

    def trigger(self) -> None:
        self.take()
        sign_token = self.take()
        if sign_token.text not in ("+", "-"):
            if sign_token.text.upper() == "SYSTEM":
                raise self.fail(
                    "ON SYSTEM READY is not supported (initialize maps in bulk)", sign_token
                )
            raise self.fail("expected + or - after ON", sign_token)
        relation, token = self.name("a relation name")
        source = self.sources.get(relation)
        if source is None:
            raise self.fail(f"trigger on undeclared relation {relation}", token)
        self.op("(")
        args = self.names(")", "a trigger variable")
        if len(args) != len(source.columns):
            raise self.fail(
                f"relation {relation} has {len(source.columns)} columns, the trigger names "
                f"{len(args)}",
                token,
            )
        seen: set[str] = set()
        for arg, arg_token in args:
            if arg in seen:
                raise self.fail(f"trigger variable {arg} appears twice", arg_token)
            seen.add(arg)
        if any(t.sign == sign_token.text and t.relation == relation for t in self.triggers):
            raise self.fail(f"a second trigger ON {sign_token.text} {relation}", token)
        self.op("{")
        statements: list[Statement] = []
        while not self.accept_op("}"):
            statements.append(self.statement(seen))
        self.triggers.append(
            Trigger(sign_token.text, relation, tuple(a for a, _ in args), tuple(statements))
        )

    def statement(self, args: set[str]) -> Statement:
        start = self.peek()
        target = self.factor()
        if len(target) != 1 or not isinstance(target[0], MapRef):
            raise self.fail("a statement starts with the map it updates", start)
        self.op("+=", " (M3 statements only add)")
        body = self.product(args, relations_only=False)
        self.op(";")
        bound = self.bound_by(body, args)
        self.check_bound(target[0].keys, bound, start)
        return Statement(target[0], tuple(body))

    # --- products and factors --------------------------------------------------------------------

    def product(self, args: set[str], relations_only: bool) -> list[Factor]:
        positions: list[tuple[Factor, Token]] = []
        while True:
            start = self.peek()
            for factor in self.factor():
                if relations_only and type(factor) is MapRef:  # a nested aggregate: MapLift
                    raise self.fail("a map definition reads base relations, not maps", start)
                positions.append((factor, start))
            if not self.accept_op("*"):
                break
        body = [f for f, _ in positions]
        bound = self.bound_by(body, args)
        for factor, token in positions:
            if isinstance(factor, Value | Guard | Lift):
                expr = factor.pred if isinstance(factor, Guard) else factor.expr
                self.check_bound(vars_of(expr), bound, token)
            elif isinstance(factor, MapLift):
                self.check_bound(lift_keys(factor), bound, token)
        return body

    def bound_by(self, body: list[Factor], args: set[str]) -> set[str]:
        bound = set(args)
        for factor in body:
            if isinstance(factor, MapLift):  # (a MIN/MAX's placeholder key binds nothing)
                bound.add(factor.var)
            elif isinstance(factor, MapRef):
                bound.update(factor.keys)
            elif isinstance(factor, Rel):
                bound.update(factor.args)
            elif isinstance(factor, Lift):
                bound.add(factor.var)
        return bound

    def check_bound(self, names: list[str] | tuple[str, ...], bound: set[str], at: Token) -> None:
        for variable in names:
            if variable not in bound:
                raise self.fail(
                    f"variable {variable} is bound by no trigger argument, map or relation", at
                )

    def factor(self) -> list[Factor]:
        token = self.peek()
        if self.accept_op("-"):
            inner = self.factor()
            if len(inner) == 1 and isinstance(inner[0], Value) and "lit" in inner[0].expr:
                lit = inner[0].expr
                lit_type = ColumnType.parse(lit["type"])
                if lit_type.kind in NUMERIC:
                    return [Value(negated_literal(lit, lit_type))]
            return [Value(dict(MINUS_ONE)), *inner]
        if self.accept_op("{"):
            expr = self.pred()
            self.op("}")
            return [Guard(expr) if is_predicate(expr) else Value(expr)]
        if self.is_op("("):
            if self.peek(1).kind in ("word", "name") and self.is_op("^=", 2):
                self.take()
                variable, _ = self.name("a variable")
                self.take()
                if self.peek().text.upper() in ("MIN", "MAX", "SLICE") and self.is_op("(", 1):
                    return [self.extreme(variable, token)]
                inner = self.factor()
                if len(inner) == 1 and type(inner[0]) is MapRef:  # a nested aggregate's value
                    self.op(")")
                    return [MapLift(inner[0].name, inner[0].keys, variable)]
                if len(inner) != 1 or not isinstance(inner[0], Value):
                    raise self.fail("a lift binds a value term or a map's value", token)
                self.op(")")
                return [Lift(variable, inner[0].expr)]
            self.take()
            inner_product = self.product_factors()
            self.op(")")
            return inner_product
        if token.kind in ("number", "string") or self.is_word("TRUE") or self.is_word("FALSE"):
            return [Value(self.primary())]
        if self.is_word("DATE") and self.is_op("(", 1):
            return [Value(self.primary())]
        if token.kind in ("word", "name"):
            return [self.reference()]
        raise self.fail(f"expected a factor, found {token.shown()}", token)

    def extreme(self, variable: str, token: Token) -> MapExtreme:
        """``MIN(cnt(type)[][g, v] [, value, delta]) )``: a nested MIN or MAX (its ``^=``
        lift's rest, the closing parenthesis included); ``SLICE(m(type)[][g, v])`` the
        entries of a slice the adjustment of one reads."""
        kind = self.take().text.lower()
        self.op("(")
        ref = self.reference()
        if type(ref) is not MapRef:
            raise self.fail("MIN and MAX read a count map", token)
        adjust = None
        if self.accept_op(","):
            value = self.pred()
            self.op(",")
            adjust = (value, self.pred())
        self.op(")")
        self.op(")")
        return MapExtreme(ref.name, ref.keys, variable, kind, adjust)

    def product_factors(self) -> list[Factor]:
        factors = self.factor()
        while self.accept_op("*"):
            factors += self.factor()
        return factors

    def reference(self) -> Factor:
        """A variable, a map reference or a relation atom, told apart by what follows."""
        identifier, token = self.name("a name")
        if self.is_op("["):
            return self.map_keys(identifier, None, token)
        if not self.is_op("("):
            return Value({"var": identifier})
        if identifier in self.maps:
            self.take()
            value_type = self.type()
            self.op(")")
            return self.map_keys(identifier, value_type, token)
        if identifier not in self.sources:
            raise self.fail(f"{identifier} is neither a declared map nor a relation", token)
        self.take()
        args = [a for a, _ in self.names(")", "a variable")]
        source = self.sources[identifier]
        if len(args) != len(source.columns):
            raise self.fail(
                f"relation {identifier} has {len(source.columns)} columns, not {len(args)}", token
            )
        return Rel(identifier, tuple(args))

    def map_keys(self, map_name: str, value_type: ColumnType | None, token: Token) -> MapRef:
        decl = self.maps.get(map_name)
        if decl is None:
            raise self.fail(f"map {map_name} is not declared", token)
        if value_type is not None and value_type != decl.value_type:
            raise self.fail(
                f"map {map_name} holds {str(decl.value_type).lower()}, "
                f"not {str(value_type).lower()}",
                token,
            )
        self.op("[")
        self.op("]", " (input keys are not supported)")
        self.op("[")
        keys = tuple(k for k, _ in self.names("]", "a key variable"))
        if len(keys) != len(decl.keys):
            raise self.fail(f"map {map_name} has {len(decl.keys)} keys, not {len(keys)}", token)
        return MapRef(map_name, keys)


def parse_program(text: str) -> Program:
    """Parse M3 text; ``errors.InvalidArgument`` names the line and column of any mistake."""
    return _Parser(text).program()
