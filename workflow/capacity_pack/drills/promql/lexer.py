"""PromQL's tokens and durations.

:func:`parse_duration` reads Prometheus' duration format
(https://prometheus.io/docs/prometheus/latest/querying/basics/#time-durations): integers with the
units ``y w d h m s ms``, each at most once and from the largest to the smallest (``1h30m``,
``500ms``); ``0`` alone needs no unit. A year is 365 days, a week 7.

:func:`lex` splits an expression into tokens: numbers (decimal, hex ``0x..``, scientific;
``Inf``/``NaN`` are identifiers the parser reads as numbers), durations, strings (double or
single quotes with Go's escapes, or back-quoted raw strings), identifiers (metric names may hold
``:``), operators and ``#`` comments to the end of the line, as in the grammar of
https://prometheus.io/docs/prometheus/latest/querying/basics/. A digit string followed by a unit
is a duration; one followed by another identifier character is an error, as in Prometheus.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from capacity_pack.drills.promql.errors import PromQLError

NS_PER_S = 1_000_000_000

_DURATION_UNITS = {
    "y": 365 * 86400 * NS_PER_S,
    "w": 7 * 86400 * NS_PER_S,
    "d": 86400 * NS_PER_S,
    "h": 3600 * NS_PER_S,
    "m": 60 * NS_PER_S,
    "s": NS_PER_S,
    "ms": 1_000_000,
}
_DURATION_RE = re.compile("".join(rf"(?:([0-9]+){unit})?" for unit in _DURATION_UNITS))


def parse_duration(text: str) -> int:
    """A Prometheus duration (``1h30m``, ``500ms``, ``0``) in nanoseconds.

    Units are y w d h m s ms, each at most once and in that order, as Prometheus requires.
    """
    if text == "0":
        return 0
    m = _DURATION_RE.fullmatch(text)
    if not text or m is None:
        raise ValueError(f"not a valid duration string: {text!r}")
    return sum(
        int(g) * unit
        for g, unit in zip(m.groups(), _DURATION_UNITS.values(), strict=True)
        if g is not None
    )


@dataclass(frozen=True)
class Token:
    """One token; ``value`` is a number's, a duration's (ns) or a string's decoded value."""

    kind: str  # num, dur, str, ident, op, eof
    text: str
    pos: int
    value: Any = None


_IDENT_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_DURATION_TOKEN_RE = re.compile(r"(?:[0-9]+(?:ms|[smhdwy]))+")
_HEX_RE = re.compile(r"0[xX][0-9a-fA-F]+")
_FLOAT_RE = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_OPERATORS = ("==", "!=", "=~", "!~", "<=", ">=", *"(){}[],=<>+-*/%^@")
_STRING_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
}


def _is_ident_char(ch: str) -> bool:
    return bool(ch) and (ch in "_:" or ("a" <= ch.lower() <= "z") or "0" <= ch <= "9")


def _lex_string(expr: str, start: int) -> tuple[str, int]:
    quote = expr[start]
    if quote == "`":
        end = expr.find("`", start + 1)
        if end < 0:
            raise PromQLError("unterminated raw string", expr, start)
        return expr[start + 1 : end], end + 1
    out: list[str] = []
    i = start + 1
    while True:
        if i >= len(expr) or expr[i] == "\n":
            raise PromQLError("unterminated quoted string", expr, start)
        ch = expr[i]
        if ch == quote:
            return "".join(out), i + 1
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        esc = expr[i + 1 : i + 2]
        if esc in _STRING_ESCAPES:
            out.append(_STRING_ESCAPES[esc])
            i += 2
        elif esc == quote:
            out.append(quote)
            i += 2
        elif esc and esc in "01234567":
            digits = expr[i + 1 : i + 4]
            if not re.fullmatch(r"[0-7]{3}", digits) or int(digits, 8) > 255:
                raise PromQLError("invalid octal escape in string", expr, i)
            out.append(chr(int(digits, 8)))
            i += 4
        elif esc and esc in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[esc]
            digits = expr[i + 2 : i + 2 + width]
            if not re.fullmatch(rf"[0-9a-fA-F]{{{width}}}", digits):
                raise PromQLError(f"invalid \\{esc} escape in string", expr, i)
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code < 0xE000:
                raise PromQLError("escape sequence is an invalid Unicode code point", expr, i)
            out.append(chr(code))
            i += 2 + width
        else:
            raise PromQLError(f"unknown escape sequence \\{esc}", expr, i)


def lex(expr: str) -> list[Token]:
    """The tokens of ``expr``, ending with an ``eof`` token; raises :class:`PromQLError`."""
    tokens: list[Token] = []
    i, n = 0, len(expr)
    while i < n:
        ch = expr[i]
        if ch.isspace():
            i += 1
        elif ch == "#":
            nl = expr.find("\n", i)
            i = n if nl < 0 else nl
        elif ch in "\"'`":
            value, end = _lex_string(expr, i)
            tokens.append(Token("str", expr[i:end], i, value))
            i = end
        elif "0" <= ch <= "9" or (ch == "." and "0" <= expr[i + 1 : i + 2] <= "9"):
            m = _DURATION_TOKEN_RE.match(expr, i)
            # A colon may follow a duration: it opens a subquery step (reported as unsupported).
            after = expr[m.end() : m.end() + 1] if m else ""
            if m and (after == ":" or not _is_ident_char(after)):
                try:
                    value = parse_duration(m.group())
                except ValueError:
                    raise PromQLError(
                        f"bad duration {m.group()!r}: units must run from y to ms, each once",
                        expr,
                        i,
                    ) from None
                tokens.append(Token("dur", m.group(), i, value))
                i = m.end()
                continue
            m = _HEX_RE.match(expr, i) or _FLOAT_RE.match(expr, i)
            assert m is not None
            if _is_ident_char(expr[m.end() : m.end() + 1]) or expr[m.end() : m.end() + 1] == ".":
                raise PromQLError("bad number or duration syntax", expr, i)
            text = m.group()
            value = float(int(text, 16)) if text[:2].lower() == "0x" else float(text)
            tokens.append(Token("num", text, i, value))
            i = m.end()
        elif _is_ident_char(ch):
            m = _IDENT_RE.match(expr, i)
            assert m is not None
            tokens.append(Token("ident", m.group(), i))
            i = m.end()
        else:
            op = next((o for o in _OPERATORS if expr.startswith(o, i)), None)
            if op is None:
                raise PromQLError(f"unexpected character {ch!r}", expr, i)
            tokens.append(Token("op", op, i))
            i += len(op)
    tokens.append(Token("eof", "", n))
    return tokens
