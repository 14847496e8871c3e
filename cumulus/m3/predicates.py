"""M3 text's predicates and values (inside braces): SQL's conditions and arithmetic -> the plan's
expression trees, by recursive descent from OR down to a primary value."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from aggview import errors
from aggview.schema import ColumnType
from cumulus.expressions import EXTRACT_UNITS, substring_bounds
from cumulus.m3.cursor import TokenCursor
from cumulus.m3.program import (
    Expr,
)
from cumulus.m3.tokens import Token
from cumulus.sqltext import date_literal, literal, negated_literal
from cumulus.typerules import NUMERIC

# functions written as calls (GREATEST and LEAST only inside a CAST to their type)
_FUNCTIONS = frozenset({"ABS", "EXTRACT", "SUBSTRING"})
_COMPARISONS = {"=": "=", "<>": "<>", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


class PredicateParser(TokenCursor):
    def pred(self) -> Expr:
        return self.chain("OR", self.conjunction)

    def conjunction(self) -> Expr:
        return self.chain("AND", self.negation)

    def chain(self, word: str, operand: Callable[[], Expr]) -> Expr:
        """``a word b word c``: one {word: [a, b, c]} (one operand: itself)."""
        parts = [operand()]
        while self.is_word(word):
            self.take()
            parts.append(operand())
        return parts[0] if len(parts) == 1 else {word.lower(): parts}

    def negation(self) -> Expr:
        if self.is_word("NOT"):
            self.take()
            return {"not": self.negation()}
        return self.comparison()

    def comparison(self) -> Expr:
        left = self.arith()
        token = self.peek()
        if token.kind == "op" and token.text in _COMPARISONS:
            self.take()
            return {"cmp": _COMPARISONS[token.text], "args": [left, self.arith()]}
        if self.is_word("IN"):
            self.take()
            self.op("(")
            values = [self.arith()]
            while self.accept_op(","):
                values.append(self.arith())
            self.op(")")
            return {"in": left, "values": values}
        if self.is_word("BETWEEN"):
            self.take()
            low = self.arith()
            self.word("AND")
            return {"between": left, "low": low, "high": self.arith()}
        if self.is_word("IS"):
            self.take()
            self.word("NOT")
            self.word("NULL")
            return {"notnull": left}
        if self.is_word("LIKE"):
            self.take()
            pattern = self.take()
            if pattern.kind != "string":
                raise self.fail("LIKE takes a quoted pattern", pattern)
            return {"like": left, "pattern": pattern.text[1:-1].replace("''", "'")}
        return left

    def arith(self) -> Expr:
        return self.left_to_right(("+", "-"), self.term)

    def term(self) -> Expr:
        return self.left_to_right(("*", "/"), self.unary)

    def left_to_right(self, ops: tuple[str, str], operand: Callable[[], Expr]) -> Expr:
        """``a op b op c`` as ((a op b) op c): one level of arithmetic's precedence."""
        left = operand()
        while any(self.is_op(op) for op in ops):
            op = self.take().text
            left = {"op": op, "args": [left, operand()]}
        return left

    def unary(self) -> Expr:
        if self.accept_op("-"):
            inner = self.unary()
            if "lit" in inner and ColumnType.parse(inner["type"]).kind in NUMERIC:
                return negated_literal(inner, ColumnType.parse(inner["type"]))
            return {"neg": inner}
        return self.primary()

    def primary(self) -> Expr:
        token = self.take()
        if token.kind == "number":
            return literal(exp.Literal.number(token.text))[0]
        if token.kind == "string":
            return literal(exp.Literal.string(token.text[1:-1].replace("''", "'")))[0]
        if token.kind == "op" and token.text == "(":
            inner = self.pred()
            self.op(")")
            return inner
        if token.kind == "word" and token.text.upper() in ("TRUE", "FALSE"):
            return {"lit": token.text.upper() == "TRUE", "type": "BOOL"}
        if token.kind == "word" and token.text.upper() == "NULL":
            return {"null": True}
        if token.kind == "word" and token.text.upper() == "CAST" and self.is_op("("):
            return self.typed_branches()
        if token.kind == "word" and token.text.upper() in _FUNCTIONS and self.is_op("("):
            return self.function(token)
        if token.kind == "word" and token.text.upper() in ("GREATEST", "LEAST") and self.is_op("("):
            raise self.fail(f"{token.text.upper()} is written in a CAST to its type", token)
        if token.kind == "word" and token.text.upper() == "DATE" and self.is_op("("):
            self.take()
            text = self.take()
            if text.kind != "string":
                raise self.fail("DATE takes a quoted 'YYYY-MM-DD'", text)
            self.op(")")
            try:
                return date_literal(text.text[1:-1], exp.Literal.string(text.text[1:-1]))
            except errors.InvalidArgument as exc:
                raise self.fail(str(exc), text) from None
        if token.kind in ("word", "name"):
            return {"var": token.text}
        raise self.fail(f"expected a value, found {token.shown()}", token)

    def function(self, token: Token) -> Expr:
        """``ABS(e)``, ``EXTRACT(YEAR|MONTH|DAY FROM e)``, ``SUBSTRING(e, start[, length])``
        (constants) and, inside a CAST to their type, ``GREATEST(e, ...)``/``LEAST(e, ...)``."""
        word = token.text.upper()
        self.op("(")
        if word == "EXTRACT":
            unit = self.take()
            if unit.kind != "word" or unit.text.upper() not in EXTRACT_UNITS:
                raise self.fail(f"EXTRACT takes {', '.join(EXTRACT_UNITS)}", unit)
            self.word("FROM")
            expr: Expr = {"fn": unit.text.lower(), "args": [self.pred()]}
        else:
            args = [self.pred()]
            while self.accept_op(","):
                args.append(self.pred())
            expr = {"fn": word.lower(), "args": args}
        self.op(")")
        if word == "ABS" and len(expr["args"]) != 1:
            raise self.fail("ABS takes one argument", token)
        if word == "SUBSTRING":
            try:
                substring_bounds(expr)
            except errors.InvalidArgument as exc:
                raise self.fail(str(exc), token) from None
        return expr

    def typed_branches(self) -> Expr:
        """``CAST(CASE WHEN p THEN e ... [ELSE e] END AS type)``, ``CAST(COALESCE(e, ...) AS
        type)`` or ``CAST(GREATEST(e, ...) AS type)`` (LEAST too): the forms the printer gives
        CASE, COALESCE, GREATEST and LEAST, with their result type."""
        self.op("(")
        token = self.take()
        expr: Expr
        if token.kind == "word" and token.text.upper() == "CASE":
            branches = []
            while self.is_word("WHEN"):
                self.take()
                when = self.pred()
                self.word("THEN")
                branches.append([when, self.pred()])
            if not branches:
                raise self.fail("CASE needs WHEN ... THEN ...", token)
            expr = {"case": branches}
            if self.is_word("ELSE"):
                self.take()
                expr["else"] = self.pred()
            self.word("END")
        elif token.kind == "word" and token.text.upper() == "COALESCE":
            self.op("(")
            args = [self.pred()]
            while self.accept_op(","):
                args.append(self.pred())
            self.op(")")
            expr = {"coalesce": args}
        elif token.kind == "word" and token.text.upper() in ("GREATEST", "LEAST"):
            expr = self.function(token)
            if len(expr["args"]) < 2:
                raise self.fail(f"{token.text.upper()} takes two arguments or more", token)
        elif token.kind == "word" and token.text.upper() in ("SUM", "AVG"):
            self.op("(")  # a nested aggregate finished from its sum and count
            total = self.pred()
            self.op(",")
            count = self.pred()
            self.op(")")
            expr = {"finish": token.text.lower(), "args": [total, count]}
        else:
            raise self.fail(
                "CAST takes a CASE, a COALESCE, a GREATEST, a LEAST, a SUM or an AVG", token
            )
        self.word("AS")
        expr["type"] = str(self.type())
        self.op(")")
        return expr
