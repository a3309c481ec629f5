"""A recursive-descent parser for the supported PromQL subset.

Binary operators are parsed by precedence climbing over :data:`~.nodes.PRECEDENCE`; unary minus
binds like ``*`` (so ``-a^b`` is ``-(a^b)`` and ``-a*b`` is ``(-a)*b``), and a negated number
literal folds into the literal. Postfix ``[range]`` applies only to a vector selector and
``offset`` (negative allowed) to an instant or range selector. Aggregations take ``by`` or
``without`` before or after their arguments, never both.

Supported beyond selectors and numbers: the functions in :data:`~.nodes.FUNCTIONS`, the
aggregations, all binary operators with ``bool``, ``on``/``ignoring`` and
``group_left``/``group_right``. Rejected with a :class:`PromQLError` that names the position and
what was expected: subqueries, ``@``, ``count_values``, any other function, string-valued
expressions, and every parse-time type error Prometheus reports (e.g. ``rate`` of an instant
vector, a comparison between scalars without ``bool``, a set operator with a scalar, grouping on
a set operator, a selector whose matchers all match the empty string).
"""

from __future__ import annotations

from dataclasses import replace

from capacity_pack.drills.promql.errors import PromQLError
from capacity_pack.drills.promql.labels import LABEL_NAME_RE
from capacity_pack.drills.promql.lexer import Token, lex
from capacity_pack.drills.promql.nodes import (
    AGGREGATIONS,
    COMPARISONS,
    FUNCTIONS,
    KEYWORDS,
    PARAM_AGGREGATIONS,
    PRECEDENCE,
    SCALAR,
    SET_OPERATORS,
    VECTOR,
    Aggregation,
    BinaryOp,
    Call,
    LabelMatcher,
    MatrixSelector,
    Node,
    NumberLiteral,
    Paren,
    UnaryOp,
    VectorMatching,
    VectorSelector,
)


def _describe(tok: Token) -> str:
    return "end of input" if tok.kind == "eof" else f'"{tok.text}"'


class _Parser:
    def __init__(self, expr: str):
        self.expr = expr
        self.tokens = lex(expr)
        self.i = 0

    def error(self, message: str, pos: int) -> PromQLError:
        return PromQLError(message, self.expr, pos)

    def peek(self, k: int = 0) -> Token:
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.peek()
        if tok.kind != "eof":
            self.i += 1
        return tok

    def at_op(self, text: str) -> bool:
        tok = self.peek()
        return tok.kind == "op" and tok.text == text

    def at_word(self, *words: str) -> bool:
        tok = self.peek()
        return tok.kind == "ident" and tok.text.lower() in words

    def expect_op(self, text: str, context: str) -> Token:
        tok = self.peek()
        if not (tok.kind == "op" and tok.text == text):
            raise self.error(f'expected "{text}" {context}, found {_describe(tok)}', tok.pos)
        return self.next()

    def parse(self) -> Node:
        if self.peek().kind == "eof":
            raise self.error("empty expression", 0)
        node = self.binary(0)
        tok = self.peek()
        if tok.kind != "eof":
            raise self.error(
                f"expected an operator or end of input, found {_describe(tok)}", tok.pos
            )
        return node

    # -- binary operators: precedence climbing ---------------------------------------------

    def binary_operator(self) -> str | None:
        tok = self.peek()
        if tok.kind == "op" and tok.text in PRECEDENCE:
            return tok.text
        if tok.kind == "ident" and tok.text.lower() in ("and", "or", "unless", "atan2"):
            return tok.text.lower()
        return None

    def binary(self, min_prec: int) -> Node:
        lhs = self.unary()
        while True:
            op = self.binary_operator()
            if op is None or PRECEDENCE[op] < min_prec:
                return lhs
            optok = self.next()
            return_bool, matching = self.modifiers(op)
            # Only ^ is right-associative: its right operand may contain another ^.
            rhs = self.binary(PRECEDENCE[op] + (0 if op == "^" else 1))
            lhs = self.make_binary(op, lhs, rhs, return_bool, matching, optok.pos)

    def modifiers(self, op: str) -> tuple[bool, VectorMatching | None]:
        return_bool = False
        if self.at_word("bool"):
            tok = self.next()
            if op not in COMPARISONS:
                raise self.error("bool modifier can only be used on comparison operators", tok.pos)
            return_bool = True
        if self.at_word("group_left", "group_right"):
            tok = self.peek()
            raise self.error(f"{tok.text} needs a preceding on(...) or ignoring(...)", tok.pos)
        if not self.at_word("on", "ignoring"):
            return return_bool, None
        on = self.next().text.lower() == "on"
        labels = self.label_list("on" if on else "ignoring")
        card, include = "one-to-one", ()
        if self.at_word("group_left", "group_right"):
            gtok = self.next()
            word = gtok.text.lower()
            card = "many-to-one" if word == "group_left" else "one-to-many"
            if self.at_op("("):
                include = self.label_list(word)
            clash = sorted(set(include) & set(labels)) if on else []
            if clash:
                raise self.error(
                    f"label {clash[0]!r} must not occur in ON and GROUP clause at once", gtok.pos
                )
        return return_bool, VectorMatching(card, on, labels, include)

    def make_binary(
        self,
        op: str,
        lhs: Node,
        rhs: Node,
        return_bool: bool,
        matching: VectorMatching | None,
        pos: int,
    ) -> Node:
        for side in (lhs, rhs):
            if side.type not in (SCALAR, VECTOR):
                raise self.error(
                    "binary expression must contain only scalar and instant vector types, "
                    f"got {side.type}",
                    side.pos,
                )
        both_vectors = lhs.type == VECTOR and rhs.type == VECTOR
        if op in SET_OPERATORS:
            if not both_vectors:
                raise self.error(
                    f"set operator {op!r} not allowed in binary scalar expression", pos
                )
            if matching is not None and matching.card != "one-to-one":
                raise self.error(f"no grouping allowed for {op!r} operation", pos)
        if op in COMPARISONS and lhs.type == rhs.type == SCALAR and not return_bool:
            raise self.error("comparisons between scalars must use the bool modifier", pos)
        if matching is not None and not both_vectors:
            raise self.error("vector matching is only allowed between instant vectors", pos)
        if both_vectors:
            matching = matching or VectorMatching("one-to-one")
            if op in SET_OPERATORS:
                matching = replace(matching, card="many-to-many")
        return BinaryOp(op, lhs, rhs, return_bool, matching, pos=pos)

    # -- unary, postfix, primary ------------------------------------------------------------

    def unary(self) -> Node:
        tok = self.peek()
        if tok.kind == "op" and tok.text in ("+", "-"):
            self.next()
            # Unary minus binds like * (so -a^b is -(a^b) and -a*b is (-a)*b), as in Prometheus.
            operand = self.binary(PRECEDENCE["^"])
            if operand.type not in (SCALAR, VECTOR):
                raise self.error(
                    f"unary expression only allowed on scalars and instant vectors, got "
                    f"{operand.type}",
                    tok.pos,
                )
            if tok.text == "+":
                return operand
            if isinstance(operand, NumberLiteral):
                return NumberLiteral(-operand.value, pos=tok.pos)
            return UnaryOp("-", operand, pos=tok.pos)
        return self.postfix()

    def postfix(self) -> Node:
        node = self.primary()
        if self.at_op("["):
            btok = self.next()
            if not isinstance(node, VectorSelector):
                raise self.error(
                    "ranges are only allowed for vector selectors (subqueries are not supported)",
                    btok.pos,
                )
            dtok = self.peek()
            if dtok.kind != "dur":
                raise self.error(
                    f"expected a duration such as 5m in the range, found {_describe(dtok)}",
                    dtok.pos,
                )
            self.next()
            if dtok.value <= 0:
                raise self.error("range duration must be greater than 0", dtok.pos)
            after = self.peek()
            if after.kind == "ident" and after.text.startswith(":"):
                raise self.error("subqueries are not supported", after.pos)
            self.expect_op("]", "to close the range selector")
            node = MatrixSelector(node, dtok.value, pos=node.pos)
        if self.at_word("offset"):
            otok = self.next()
            if not isinstance(node, VectorSelector | MatrixSelector):
                raise self.error(
                    "offset modifier must follow an instant or range vector selector", otok.pos
                )
            sign = 1
            if self.at_op("-"):
                self.next()
                sign = -1
            dtok = self.peek()
            if dtok.kind != "dur":
                raise self.error(
                    f"expected a duration after offset, found {_describe(dtok)}", dtok.pos
                )
            self.next()
            if isinstance(node, MatrixSelector):
                node = replace(node, selector=replace(node.selector, offset_ns=sign * dtok.value))
            else:
                node = replace(node, offset_ns=sign * dtok.value)
        if self.at_op("@"):
            raise self.error("the @ modifier is not supported", self.peek().pos)
        return node

    def primary(self) -> Node:
        tok = self.peek()
        if tok.kind == "num":
            self.next()
            return NumberLiteral(tok.value, pos=tok.pos)
        if tok.kind == "dur":
            raise self.error(
                f"unexpected duration {tok.text!r}: durations belong in range selectors and "
                "after offset",
                tok.pos,
            )
        if tok.kind == "str":
            raise self.error("string literals are only supported as label matcher values", tok.pos)
        if tok.kind == "op" and tok.text == "(":
            self.next()
            inner = self.binary(0)
            self.expect_op(")", f"to close the parenthesis opened at position {tok.pos}")
            return Paren(inner, pos=tok.pos)
        if tok.kind == "op" and tok.text == "{":
            return self.selector(None, tok.pos)
        if tok.kind == "ident":
            low = tok.text.lower()
            if low in ("inf", "nan"):
                self.next()
                return NumberLiteral(float(low), pos=tok.pos)
            if low == "count_values":
                raise self.error("aggregation count_values is not supported", tok.pos)
            if low in AGGREGATIONS:
                return self.aggregation()
            nxt = self.peek(1)
            if nxt.kind == "op" and nxt.text == "(":
                return self.call()
            if low in KEYWORDS:
                raise self.error(
                    f"unexpected keyword {tok.text!r}, expected an expression", tok.pos
                )
            self.next()
            return self.selector(tok.text, tok.pos)
        if tok.kind == "eof":
            raise self.error("unexpected end of input, expected an expression", tok.pos)
        raise self.error(f"unexpected {_describe(tok)}, expected an expression", tok.pos)

    def selector(self, name: str | None, pos: int) -> VectorSelector:
        matchers: list[LabelMatcher] = []
        brace_pos = pos
        if self.at_op("{"):
            brace_pos = self.next().pos
            while not self.at_op("}"):
                ltok = self.next()
                if ltok.kind != "ident" or not LABEL_NAME_RE.fullmatch(ltok.text):
                    raise self.error(
                        f"expected a label name in the label matchers, found {_describe(ltok)}",
                        ltok.pos,
                    )
                otok = self.next()
                if otok.kind != "op" or otok.text not in ("=", "!=", "=~", "!~"):
                    raise self.error(
                        f"expected one of = != =~ !~ after label {ltok.text!r}, found "
                        f"{_describe(otok)}",
                        otok.pos,
                    )
                vtok = self.next()
                if vtok.kind != "str":
                    raise self.error(
                        f"expected a quoted string as the value for label {ltok.text!r}, found "
                        f"{_describe(vtok)}",
                        vtok.pos,
                    )
                try:
                    matchers.append(LabelMatcher(ltok.text, otok.text, vtok.value))
                except PromQLError as err:
                    raise self.error(err.message, vtok.pos) from None
                if self.at_op(","):
                    self.next()
                elif not self.at_op("}"):
                    tok = self.peek()
                    raise self.error(
                        f'expected "," or "}}" in the label matchers, found {_describe(tok)}',
                        tok.pos,
                    )
            self.next()
        if name is not None:
            if any(m.name == "__name__" for m in matchers):
                raise self.error("metric name must not be set twice", brace_pos)
            matchers.insert(0, LabelMatcher("__name__", "=", name))
        if all(m.matches("") for m in matchers):
            raise self.error(
                "vector selector must contain at least one matcher that does not match the "
                "empty string",
                brace_pos,
            )
        return VectorSelector(name, tuple(matchers), pos=pos)

    def label_list(self, context: str) -> tuple[str, ...]:
        self.expect_op("(", f"after {context}")
        names: list[str] = []
        while not self.at_op(")"):
            tok = self.next()
            if tok.kind != "ident" or not LABEL_NAME_RE.fullmatch(tok.text):
                raise self.error(
                    f"expected a label name in the {context} list, found {_describe(tok)}", tok.pos
                )
            names.append(tok.text)
            if self.at_op(","):
                self.next()
            elif not self.at_op(")"):
                tok = self.peek()
                raise self.error(
                    f'expected "," or ")" in the {context} list, found {_describe(tok)}', tok.pos
                )
        self.next()
        return tuple(names)

    def call(self) -> Call:
        ftok = self.next()
        name = ftok.text
        spec = FUNCTIONS.get(name)
        if spec is None:
            raise self.error(f"unknown or unsupported function {name!r}", ftok.pos)
        self.next()
        args: list[Node] = []
        if not self.at_op(")"):
            args.append(self.binary(0))
            while self.at_op(","):
                self.next()
                args.append(self.binary(0))
        self.expect_op(")", f"to close the call to {name}()")
        most = len(spec.args)
        least = most - spec.optional
        if not least <= len(args) <= most:
            wanted = str(most) if least == most else f"{least} to {most}"
            raise self.error(
                f"expected {wanted} argument(s) in call to {name}(), got {len(args)}", ftok.pos
            )
        for arg, want in zip(args, spec.args, strict=False):
            if arg.type != want:
                raise self.error(
                    f"expected type {want} in call to function {name!r}, got {arg.type}", arg.pos
                )
        return Call(name, tuple(args), pos=ftok.pos)

    def aggregation(self) -> Aggregation:
        atok = self.next()
        op = atok.text.lower()
        grouping: tuple[str, ...] = ()
        without = grouped = False
        if self.at_word("by", "without"):
            without = self.next().text.lower() == "without"
            grouping = self.label_list("without" if without else "by")
            grouped = True
        self.expect_op("(", f"after the aggregation {op}")
        param = None
        if op in PARAM_AGGREGATIONS:
            param = self.binary(0)
            self.expect_op(",", f"after the parameter of {op}")
        expr = self.binary(0)
        self.expect_op(")", f"to close {op}(...)")
        while self.at_word("by", "without"):
            tok = self.next()
            if grouped:
                raise self.error(f"{op} has two grouping clauses", tok.pos)
            without = tok.text.lower() == "without"
            grouping = self.label_list("without" if without else "by")
            grouped = True
        if param is not None and param.type != SCALAR:
            raise self.error(
                f"expected type scalar as the parameter of {op}, got {param.type}", param.pos
            )
        if expr.type != VECTOR:
            raise self.error(
                f"expected type instant vector in aggregation expression, got {expr.type}",
                expr.pos,
            )
        return Aggregation(op, expr, param, grouping, without, pos=atok.pos)


def parse(expr: str) -> Node:
    """Parse a PromQL expression of the supported subset; raises :class:`PromQLError`."""
    return _Parser(expr).parse()


def selected_metrics(expr: str | Node) -> set[str]:
    """Metric names the expression's selectors name exactly (regex name matchers excluded)."""
    node = parse(expr) if isinstance(expr, str) else expr
    return {
        m.value
        for n in node.walk()
        if isinstance(n, VectorSelector)
        for m in n.matchers
        if m.name == "__name__" and m.op == "="
    }
