"""A cursor over M3 text's tokens, with the checks every part of the M3 parser makes: each
failure names the line and column where the text goes wrong."""

from __future__ import annotations

from aggview import errors
from aggview.schema import ColumnType
from cumulus.m3.tokens import Token, tokenize

_TYPE_NAMES = {"string": "TEXT", "double": "FLOAT", "long": "INT", "integer": "INT"}


class TokenCursor:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.pos = 0

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.peek()
        self.pos += 1
        return token

    def fail(self, message: str, token: Token | None = None) -> errors.InvalidArgument:
        token = token or self.peek()
        return errors.InvalidArgument(f"M3 text, {token.where()}: {message}")

    def is_op(self, op: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == "op" and token.text == op

    def is_word(self, word: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == "word" and token.text.upper() == word

    def op(self, op: str, what: str = "") -> Token:
        if not self.is_op(op):
            raise self.fail(f"expected {op!r}{what}, found {self.peek().shown()}")
        return self.take()

    def word(self, word: str) -> Token:
        if not self.is_word(word):
            raise self.fail(f"expected {word}, found {self.peek().shown()}")
        return self.take()

    def accept_op(self, op: str) -> bool:
        if self.is_op(op):
            self.pos += 1
            return True
        return False

    def name(self, what: str) -> tuple[str, Token]:
        token = self.peek()
        if token.kind not in ("word", "name"):
            raise self.fail(f"expected {what}, found {token.shown()}")
        self.pos += 1
        return token.text, token

    def names(self, close: str, what: str) -> list[tuple[str, Token]]:
        found: list[tuple[str, Token]] = []
        while not self.accept_op(close):
            if found:
                self.op(",", f" or {close!r}")
            found.append(self.name(what))
        return found

    def type(self) -> ColumnType:
        text, token = self.name("a type")
        if self.is_op("("):
            self.take()
            args = [self.take().text]
            while self.accept_op(","):
                args.append(self.take().text)
            self.op(")")
            text += f"({','.join(args)})"
        try:
            return ColumnType.parse(_TYPE_NAMES.get(text.lower(), text))
        except errors.InvalidArgument:
            raise self.fail(f"unknown type {text!r}", token) from None
