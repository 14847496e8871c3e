"""Tokens of M3 text, each with its line and column (every parse error names them).

``--`` starts a comment to the end of the line, so DBToaster's section banners are comments;
``"name"`` quotes a name that is a keyword; a plain name is a ``word`` (maybe a keyword).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aggview import errors

_TOKEN = re.compile(
    r"""(?P<space>\s+|--[^\n]*)
      | (?P<number>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
      | (?P<string>'(?:[^']|'')*')
      | (?P<quoted>"(?:[^"]|"")+")
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op>\+=|\^=|:=|<=|>=|<>|!=|[-+*/(){}\[\],;:=<>])""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # number, string, name, word (an unquoted name), op, end
    text: str
    line: int
    column: int

    def where(self) -> str:
        return f"line {self.line}, column {self.column}"

    def shown(self) -> str:
        return "the end of the text" if self.kind == "end" else repr(self.text)


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    line, line_start, pos = 1, 0, 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise errors.InvalidArgument(
                f"M3 text, line {line}, column {pos - line_start + 1}: unexpected character "
                f"{text[pos]!r}"
            )
        kind = match.lastgroup
        assert kind is not None
        value = match.group()
        if kind != "space":
            if kind == "quoted":
                kind, value = "name", value[1:-1].replace('""', '"')
            elif kind == "name":
                kind = "word"
            tokens.append(Token(kind, value, line, pos - line_start + 1))
        for offset, char in enumerate(match.group()):
            if char == "\n":
                line, line_start = line + 1, pos + offset + 1
        pos = match.end()
    tokens.append(Token("end", "", line, pos - line_start + 1))
    return tokens
