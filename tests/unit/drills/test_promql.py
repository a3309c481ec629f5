"""PromQL subset and alert evaluation: hand-computed cases, and promtool as the reference."""

from __future__ import annotations

import math
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from capacity_pack.drills.promql import (
    Aggregation,
    AlertRule,
    BinaryOp,
    MatrixSelector,
    NumberLiteral,
    PromQLError,
    RuleFileError,
    SeriesStore,
    UnaryOp,
    VectorSelector,
    alert_timeline,
    evaluate,
    evaluate_alerts,
    format_labels,
    load_rules,
    parse,
    parse_duration,
    parse_labels,
    selected_metrics,
)

S = 1_000_000_000
M = 60 * S
PROMTOOL = shutil.which("promtool") or (
    "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None
)
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian package 'prometheus'); the checks against "
    "Prometheus' own rule evaluation need it",
)


def make_store(
    series: dict[str, list[float | None]], step_ns: int = M, times: list[int] | None = None
) -> SeriesStore:
    """Series text -> values per scrape (None: absent from that scrape); scrapes every step."""
    rows = []
    n = max(len(v) for v in series.values())
    stamps = times if times is not None else [i * step_ns for i in range(n)]
    for text, values in series.items():
        metric, brace, rest = text.partition("{")
        for t, v in zip(stamps, values, strict=False):
            if v is not None:
                rows.append((t, metric, brace + rest, float(v)))
    frame = pd.DataFrame(rows, columns=["t_ns", "metric", "labels", "value"])
    return SeriesStore.from_frame(frame, np.asarray(stamps[:n], dtype=np.int64))


def at(store: SeriesStore, expr: str, t_ns: int, **kwargs) -> dict[str, float]:
    """Instant-vector result as {canonical label text: value}."""
    result = evaluate(expr, store, t_ns, **kwargs)
    assert isinstance(result, list), result
    out = {format_labels(labels): value for labels, value in result}
    assert len(out) == len(result), "duplicate label sets in a result"
    return out


def one(store: SeriesStore, expr: str, t_ns: int, **kwargs) -> float:
    values = list(at(store, expr, t_ns, **kwargs).values())
    assert len(values) == 1, values
    return values[0]


EMPTY = make_store({"unused": [0.0]})


# ---------------------------------------------------------------------------------------------
# Parser


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("2 ^ 3 ^ 2", 512.0),  # right-associative: 2^(3^2)
        ("-2 ^ 2", -4.0),  # ^ binds tighter than unary minus
        ("2 ^ -1", 0.5),
        ("10 - 2 - 3", 5.0),  # left-associative
        ("12 / 2 / 3", 2.0),
        ("2 * 3 % 4", 2.0),  # (2*3) % 4
        ("-7 % 3", -1.0),  # the dividend's sign, as Go's math.Mod
        ("1 + 2 == bool 3", 1.0),  # comparisons bind looser than +
        ("1 < bool 2 - 5", 0.0),
        ("0x1F + 1e1 + .5 + 2.5E-1", 41.75),
        ("1 / 0", math.inf),
        ("# a comment\n 4 * 2", 8.0),
    ],
)
def test_scalar_precedence_and_literals(expr, value):
    assert evaluate(expr, EMPTY, 0) == value


def test_special_float_literals():
    assert evaluate("Inf", EMPTY, 0) == math.inf
    assert evaluate("-inf", EMPTY, 0) == -math.inf
    assert math.isnan(evaluate("NaN", EMPTY, 0))
    assert math.isnan(evaluate("0 / 0", EMPTY, 0))


def sel(name: str) -> VectorSelector:
    node = parse(name)
    assert isinstance(node, VectorSelector)
    return node


def test_ast_shape_follows_precedence():
    a, b, c, d = (sel(x) for x in "abcd")
    assert parse("a or b and c unless d") == BinaryOp(
        "or",
        a,
        BinaryOp("unless", BinaryOp("and", b, c, matching=_many()), d, matching=_many()),
        matching=_many(),
    )
    tree = parse("a + b * c > d")
    assert isinstance(tree, BinaryOp) and tree.op == ">"
    assert isinstance(tree.lhs, BinaryOp) and tree.lhs.op == "+"
    assert isinstance(tree.lhs.rhs, BinaryOp) and tree.lhs.rhs.op == "*"
    minus_times = parse("-a * b")
    assert isinstance(minus_times, BinaryOp) and isinstance(minus_times.lhs, UnaryOp)
    minus_pow = parse("-a ^ b")
    assert isinstance(minus_pow, UnaryOp) and isinstance(minus_pow.expr, BinaryOp)
    assert parse("-1") == NumberLiteral(-1.0)


def _many():
    from capacity_pack.drills.promql import VectorMatching

    return VectorMatching("many-to-many")


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("sum by (a, b) (x)", "sum(x) by (a, b)"),
        ("max without (instance) (x)", "max(x) without (instance)"),
        ("topk by (a) (2, x)", "topk(2, x) by (a)"),
        ("SUM BY (a) (x)", "sum(x) by (a)"),  # keywords are case-insensitive
    ],
)
def test_grouping_clause_in_either_position(before, after):
    assert parse(before) == parse(after)
    node = parse(before)
    assert isinstance(node, Aggregation)
    assert node.grouping in (("a", "b"), ("instance",), ("a",))


def test_grouping_fields():
    node = parse("sum without (i) (x)")
    assert isinstance(node, Aggregation) and node.without and node.grouping == ("i",)
    node = parse("count(x)")
    assert isinstance(node, Aggregation) and not node.without and node.grouping == ()


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("30s", 30 * S),
        ("1m", 60 * S),
        ("500ms", S // 2),
        ("1m30s", 90 * S),
        ("2h", 7200 * S),
        ("1d", 86400 * S),
        ("1h2m3s4ms", 3723 * S + 4_000_000),
    ],
)
def test_range_durations(text, ns):
    node = parse(f"rate(x[{text}])")
    matrix = node.args[0]
    assert isinstance(matrix, MatrixSelector) and matrix.range_ns == ns
    assert parse_duration(text) == ns


@pytest.mark.parametrize("bad", ["", "5", "1.5m", "5m1h", "1s1s", "5 m", "-1m"])
def test_invalid_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_zero_duration_and_offsets():
    assert parse_duration("0") == 0
    node = parse("x offset 5m")
    assert isinstance(node, VectorSelector) and node.offset_ns == 300 * S
    rate = parse("rate(x[1m] offset -30s)")
    assert rate.args[0].selector.offset_ns == -30 * S


@pytest.mark.parametrize(
    ("expr", "pos", "fragment"),
    [
        ("rate(x[5m)", 9, 'expected "]"'),
        ("sum(x) by (a", 12, 'expected "," or ")"'),
        ('x{a="b"', 7, 'expected "," or "}"'),
        ('x{a="b" c="d"}', 8, 'expected "," or "}"'),
        ("rate(x)", 5, "expected type range vector in call to function 'rate'"),
        ("abs(x[5m])", 4, "expected type instant vector"),
        ("foo(x)", 0, "unknown or unsupported function 'foo'"),
        ("label_replace(x, 'a', 'b', 'c', 'd')", 0, "unknown or unsupported function"),
        ("x[5m:1m]", 4, "subqueries are not supported"),
        ("(x)[5m]", 3, "ranges are only allowed for vector selectors"),
        ("x @ 100", 2, "@ modifier is not supported"),
        ("1 > 2", 2, "comparisons between scalars must use the bool modifier"),
        ("x + bool y", 4, "bool modifier can only be used on comparison operators"),
        ('x{a=~"("}', 5, "invalid regular expression"),
        ('{a=""}', 0, "at least one matcher that does not match the empty string"),
        ('x{__name__="y"}', 1, "metric name must not be set twice"),
        ("rate(x[0s])", 7, "greater than 0"),
        ("x[5m1h]", 2, "bad duration"),
        ("x[5]", 2, "expected a duration"),
        ("5m", 0, "unexpected duration"),
        ('"text"', 0, "string literals"),
        ("x and 1", 2, "set operator 'and' not allowed in binary scalar expression"),
        ("x and on(a) group_left y", 2, "no grouping allowed for 'and'"),
        ("x * group_left y", 4, "needs a preceding on(...) or ignoring(...)"),
        ("a * on(b) group_left(b) c", 10, "must not occur in ON and GROUP clause"),
        ("1 * on(a) x", 2, "vector matching is only allowed between instant vectors"),
        ("count_values('v', x)", 0, "count_values is not supported"),
        ("sum(x) by (a) by (b)", 14, "two grouping clauses"),
        ("topk(x)", 6, 'expected ","'),
        ("quantile(x, y)", 9, "expected type scalar as the parameter of quantile"),
        ("sum(rate(x[5m])[5m])", 15, "ranges are only allowed"),
        ("rate(x[5m]) offset 1m", 12, "offset modifier must follow"),
        ("x +", 3, "unexpected end of input, expected an expression"),
        ("x y", 2, "expected an operator or end of input"),
        ("1 + ", 4, "unexpected end of input"),
        ("x ! y", 2, "unexpected character '!'"),
        ("12ab", 0, "bad number or duration syntax"),
        ("by", 0, "unexpected keyword 'by'"),
        ("", 0, "empty expression"),
        ('x{a="\\q"}', 5, "unknown escape sequence"),
        ('x{a="b}', 4, "unterminated quoted string"),
        ("scalar(x) > bool x[1m]", 17, "binary expression must contain only scalar and instant"),
        ("-x[1m]", 0, "unary expression only allowed on scalars and instant vectors"),
        ("histogram_quantile(0.9)", 0, "expected 2 argument(s)"),
    ],
)
def test_parse_errors_report_position_and_expectation(expr, pos, fragment):
    with pytest.raises(PromQLError) as info:
        parse(expr)
    err = info.value
    assert fragment in err.message
    assert err.pos == pos
    assert f"at position {pos}" in str(err)


def test_error_reports_line_and_column_of_multiline_expressions():
    with pytest.raises(PromQLError) as info:
        parse("sum(\n  rate(x[5m]\n)")
    assert info.value.pos == 19
    assert "(line 3, column 2)" in str(info.value)


def test_string_escapes_in_matchers():
    node = parse(r'x{a="tab\there", b=~`\d+`, c=' + "'q\\'uote'" + r', d="\u00e9\x41\101"}')
    assert isinstance(node, VectorSelector)
    values = {m.name: m.value for m in node.matchers}
    assert values == {"__name__": "x", "a": "tab\there", "b": r"\d+", "c": "q'uote", "d": "éAA"}


def test_selected_metrics():
    expr = (
        'sum by (engine) (rate(router:requests_total{code=~"5.."}[5m])) '
        "/ on(engine) vllm:num_requests_waiting "
        'or absent({__name__="up", job="x"}) or {__name__=~"ignored.*"}'
    )
    assert selected_metrics(expr) == {
        "router:requests_total",
        "vllm:num_requests_waiting",
        "up",
    }
    assert selected_metrics(parse("time() + 1")) == set()


# ---------------------------------------------------------------------------------------------
# Selectors and staleness


SELECT = make_store(
    {
        'm{a="1",b="x"}': [1.0],
        'm{a="2",b="y"}': [2.0],
        'm{a="12"}': [12.0],
        'n{a="1"}': [100.0],
        r'esc{path="a\"b\\c\nd"}': [7.0],
    }
)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('m{a="1"}', {'{__name__="m",a="1",b="x"}': 1.0}),
        ('m{a!="1"}', {'{__name__="m",a="2",b="y"}': 2.0, '{__name__="m",a="12"}': 12.0}),
        ('m{a=~"1"}', {'{__name__="m",a="1",b="x"}': 1.0}),  # anchored: "12" does not match
        ('m{a=~"1.*"}', {'{__name__="m",a="1",b="x"}': 1.0, '{__name__="m",a="12"}': 12.0}),
        ('m{b!~"x|y"}', {'{__name__="m",a="12"}': 12.0}),  # a missing label is ""
        ('m{b=""}', {'{__name__="m",a="12"}': 12.0}),
        ('m{b!=""}', {'{__name__="m",a="1",b="x"}': 1.0, '{__name__="m",a="2",b="y"}': 2.0}),
        (
            '{__name__=~"m|n", a="1"}',
            {'{__name__="m",a="1",b="x"}': 1.0, '{__name__="n",a="1"}': 100.0},
        ),
        ('{__name__!="m", a="1"}', {'{__name__="n",a="1"}': 100.0}),
        ('m{a="3"}', {}),
        ("missing_metric", {}),
        (r'esc{path="a\"b\\c\nd"}', {r'{__name__="esc",path="a\"b\\c\nd"}': 7.0}),
    ],
)
def test_selector_matchers(expr, expected):
    assert at(SELECT, expr, 0) == expected


def test_label_text_round_trip_and_store_normalisation():
    text = r'{b="x\"y",a="1\\2\n"}'
    labels = parse_labels(text)
    assert labels == {"b": 'x"y', "a": "1\\2\n"}
    assert parse_labels(format_labels(labels)) == labels
    assert format_labels(labels) == r'{a="1\\2\n",b="x\"y"}'
    # Two spellings of one label set are one series; an empty label value means no label.
    frame = pd.DataFrame(
        {
            "t_ns": [0, M],
            "metric": ["q", "q"],
            "labels": ['{a="1", b="2", c=""}', '{b="2",a="1"}'],
            "value": [1.0, 2.0],
        }
    )
    store = SeriesStore.from_frame(frame, [0, M])
    assert store.series_count == 1
    assert one(store, "count_over_time(q[5m])", M) == 2.0
    assert at(store, "q", M) == {'{__name__="q",a="1",b="2"}': 2.0}
    with pytest.raises(ValueError):
        parse_labels('{a="1"')


STALE = make_store(
    {
        'g{r="0"}': [1.0, 2.0, None, None, 5.0, 6.0],
        'g{r="1"}': [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    }
)


def test_vanished_series_is_stale_at_once():
    assert at(STALE, "g", 1 * M) == {'{__name__="g",r="0"}': 2.0, '{__name__="g",r="1"}': 1.0}
    # Gone at the scrape it is missing from, not 5 minutes of lookback later.
    assert at(STALE, "g", 2 * M) == {'{__name__="g",r="1"}': 1.0}
    assert at(STALE, "g", 2 * M - 1) == {'{__name__="g",r="0"}': 2.0, '{__name__="g",r="1"}': 1.0}
    assert at(STALE, "g", 3 * M + 30 * S) == {'{__name__="g",r="1"}': 1.0}
    assert at(STALE, 'g{r="0"}', 4 * M) == {'{__name__="g",r="0"}': 5.0}
    assert at(STALE, "count(g)", 3 * M) == {"": 1.0}


def test_range_selectors_skip_staleness_markers():
    # The range still holds the samples before the marker; the instant selector does not.
    assert one(STALE, 'last_over_time(g{r="0"}[5m])', 3 * M) == 2.0
    assert at(STALE, 'g{r="0"}', 3 * M) == {}
    assert one(STALE, 'count_over_time(g{r="0"}[5m])', 5 * M) == 4.0
    assert one(STALE, 'max_over_time(g{r="0"}[150s])', 3 * M) == 2.0


def test_lookback_window_after_the_last_scrape():
    store = make_store({"h": [3.0]})  # one scrape, nothing later to mark it stale
    lookback = 300 * S
    assert at(store, "h", lookback) == {'{__name__="h"}': 3.0}  # closed on the left (2.x)
    assert at(store, "h", lookback + 1) == {}
    assert at(store, "h", lookback, left_open=True) == {}
    assert at(store, "h", 60 * S, lookback_ns=30 * S) == {}
    assert at(store, "h", -1) == {}  # nothing before the first sample


def test_without_scrape_list_every_sample_time_is_a_scrape():
    frame = pd.DataFrame(
        {
            "t_ns": [0, 0, M],
            "metric": ["u", "u", "u"],
            "labels": ['{i="a"}', '{i="b"}', '{i="a"}'],
            "value": [1.0, 1.0, 1.0],
        }
    )
    store = SeriesStore.from_frame(frame)
    assert at(store, "u", M) == {'{__name__="u",i="a"}': 1.0}


def test_offset_shifts_evaluation_time():
    assert at(STALE, 'g{r="0"} offset 4m', 5 * M) == {'{__name__="g",r="0"}': 2.0}
    assert one(STALE, 'sum_over_time(g{r="0"}[1m] offset 1m)', 2 * M) == 3.0


# ---------------------------------------------------------------------------------------------
# rate, increase, delta and friends, against the documented algorithm by hand


def counter_store(stamps_s: list[float], values: list[float]) -> SeriesStore:
    return make_store({"c": values}, times=[round(t * S) for t in stamps_s])


def test_increase_without_reset_and_samples_on_the_range_boundaries():
    # 0..50 at 0,60..300 s; range [0, 300]: no extrapolation needed.
    store = counter_store([0, 60, 120, 180, 240, 300], [0, 10, 20, 30, 40, 50])
    assert one(store, "increase(c[5m])", 300 * S) == pytest.approx(50.0)
    assert one(store, "rate(c[5m])", 300 * S) == pytest.approx(50.0 / 300)
    # Left-open range (Prometheus 3): 10..50 from 60 s; 60 s to the start < 1.1 * 60 s, so it
    # extrapolates all the way: 40 * (240 + 60) / 240 = 50.
    assert one(store, "increase(c[5m])", 300 * S, left_open=True) == pytest.approx(50.0)


def test_increase_extrapolates_to_both_boundaries():
    # Samples at 15..255 s, 100..140. Range [0, 300]: 15 s before, 45 s after, both < 66 s
    # (1.1 x the 60 s average interval): 40 * (240 + 15 + 45) / 240 = 50.
    store = counter_store([15, 75, 135, 195, 255], [100, 110, 120, 130, 140])
    assert one(store, "increase(c[5m])", 300 * S) == pytest.approx(50.0)
    assert one(store, "rate(c[5m])", 300 * S) == pytest.approx(50.0 / 300)


def test_increase_with_counter_reset():
    # 0 10 20 | 5 15 25: the drop to 5 adds back 20, increase = 25 - 0 + 20 = 45.
    store = counter_store([0, 60, 120, 180, 240, 300], [0, 10, 20, 5, 15, 25])
    assert one(store, "increase(c[5m])", 300 * S) == pytest.approx(45.0)
    assert one(store, "rate(c[5m])", 300 * S) == pytest.approx(0.15)
    assert one(store, "resets(c[5m])", 300 * S) == 1.0
    # irate: the last two samples; a drop means the counter restarted from 0.
    assert one(store, "irate(c[5m])", 300 * S) == pytest.approx(10 / 60)
    assert one(store, "irate(c[5m])", 180 * S) == pytest.approx(5 / 60)
    assert one(store, "idelta(c[5m])", 180 * S) == pytest.approx(-15.0)


def test_series_starting_inside_the_range_extrapolates_half_an_interval():
    # 100 110 120 at 180..300 s: 180 s to the start is > 66 s, so only 30 s (half the interval)
    # is added: 20 * (120 + 30) / 120 = 25.
    store = counter_store([180, 240, 300], [100, 110, 120])
    assert one(store, "increase(c[5m])", 300 * S) == pytest.approx(25.0)


def test_counter_is_not_extrapolated_below_zero():
    # 1 11 21: the line through the samples hits 0 6 s before the first one (120 * 1/20), which
    # caps the 30 s extrapolation: 20 * (120 + 6) / 120 = 21.
    store = counter_store([180, 240, 300], [1, 11, 21])
    assert one(store, "increase(c[5m])", 300 * S) == pytest.approx(21.0)


def test_rate_needs_two_samples():
    store = counter_store([0, 60, 120, 180, 240, 300], [0, 10, 20, 30, 40, 50])
    assert at(store, "rate(c[1m])", 330 * S) == {}  # only the 300 s sample in [270, 330]
    assert one(store, "rate(c[1m])", 300 * S) == pytest.approx(10 / 60)
    assert at(store, "irate(c[30s])", 300 * S) == {}
    assert at(store, "deriv(c[30s])", 300 * S) == {}


def test_delta_on_a_gauge_and_increase_reading_drops_as_resets():
    # 10 5 0 at 15 75 135 s, range [0, 150]: -10 * (120 + 15 + 15) / 120 = -12.5.
    store = counter_store([15, 75, 135], [10, 5, 0])
    assert one(store, "delta(c[150s])", 150 * S) == pytest.approx(-12.5)
    # increase reads each drop as a reset: -10 + 10 + 5 = 5, then * 150 / 120.
    assert one(store, "increase(c[150s])", 150 * S) == pytest.approx(6.25)
    assert one(store, "deriv(c[150s])", 150 * S) == pytest.approx(-5 / 60)


def test_results_do_not_depend_on_the_time_origin():
    # Epoch nanoseconds exceed float precision; the store must keep times as integers.
    epoch = 1_767_225_600 * S + 123_456_789
    stamps = [15, 75, 135, 195, 255]
    values = [100, 110, 120, 130, 140]
    shifted = make_store({"c": values}, times=[epoch + t * S for t in stamps])
    assert one(shifted, "increase(c[5m])", epoch + 300 * S) == pytest.approx(50.0)
    assert one(shifted, "c", epoch + 255 * S) == 140.0
    assert at(shifted, "c", epoch + 255 * S - 1) == {'{__name__="c"}': 130.0}
    assert evaluate("time()", shifted, epoch) == pytest.approx(epoch / S)


def test_rate_drops_the_metric_name_but_last_over_time_keeps_it():
    store = make_store({'c{i="a"}': [0, 10, 20]})
    assert set(at(store, "rate(c[5m])", 2 * M)) == {'{i="a"}'}
    assert set(at(store, "last_over_time(c[5m])", 2 * M)) == {'{__name__="c",i="a"}'}


def test_over_time_functions():
    store = make_store({"q": [4, 1, None, 7, 2]})
    t = 4 * M  # range [1m, 4m] holds 1, 7, 2 (the marker at 2m is no sample)
    assert one(store, "sum_over_time(q[3m])", t) == 10.0
    assert one(store, "avg_over_time(q[3m])", t) == pytest.approx(10 / 3)
    assert one(store, "min_over_time(q[3m])", t) == 1.0
    assert one(store, "max_over_time(q[3m])", t) == 7.0
    assert one(store, "count_over_time(q[3m])", t) == 3.0
    assert one(store, "last_over_time(q[3m])", t) == 2.0
    assert one(store, "present_over_time(q[3m])", t) == 1.0
    assert one(store, "stddev_over_time(q[3m])", t) == pytest.approx(statistics.pstdev([1, 7, 2]))
    assert one(store, "stdvar_over_time(q[3m])", t) == pytest.approx(
        statistics.pvariance([1, 7, 2])
    )
    assert one(store, "quantile_over_time(0.5, q[3m])", t) == 2.0
    assert one(store, "quantile_over_time(0.75, q[3m])", t) == pytest.approx(4.5)
    assert one(store, "changes(q[5m])", t) == 3.0
    assert at(store, "absent_over_time(q[3m])", t) == {}
    assert at(store, 'absent_over_time(nope{job="x"}[3m])', t) == {'{job="x"}': 1.0}


# ---------------------------------------------------------------------------------------------
# histogram_quantile


HIST = make_store(
    {
        'h_bucket{engine="0",le="0.1"}': [10],
        'h_bucket{engine="0",le="0.5"}': [30],
        'h_bucket{engine="0",le="1"}': [45],
        'h_bucket{engine="0",le="+Inf"}': [50],
        'h_bucket{engine="1",le="0.1"}': [0],
        'h_bucket{engine="1",le="0.5"}': [0],
        'h_bucket{engine="1",le="1"}': [4],
        'h_bucket{engine="1",le="+Inf"}': [4],
        'noinf_bucket{le="0.1"}': [1],
        'noinf_bucket{le="1"}': [2],
    }
)


@pytest.mark.parametrize(
    ("phi", "engine0", "engine1"),
    [
        (0.5, 0.4, 0.75),  # rank 25 in (10, 30]: 0.1 + 0.4 * 15/20; rank 2 in (0, 4]: 0.5 + 0.5/2
        (0.1, 0.05, 0.55),  # rank 5 in the first bucket, which starts at 0
        (0.9, 1.0, 0.95),  # rank 45 is exactly the le="1" count
        (0.95, 1.0, 0.975),  # rank 47.5 falls in +Inf: its lower bound
        (0.0, 0.0, math.nan),  # rank 0 in an empty first bucket: 0/0, as in Prometheus
        (-1.0, -math.inf, -math.inf),
        (2.0, math.inf, math.inf),
    ],
)
def test_histogram_quantile_interpolates_within_the_bucket(phi, engine0, engine1):
    got = at(HIST, f"histogram_quantile({phi}, h_bucket)", 0)
    assert set(got) == {'{engine="0"}', '{engine="1"}'}
    assert got['{engine="0"}'] == pytest.approx(engine0)
    assert got['{engine="1"}'] == pytest.approx(engine1, nan_ok=True)


def test_histogram_quantile_of_aggregated_buckets_and_missing_inf():
    # Summed per le: 10 30 49 54; rank 27 in (10, 30]: 0.1 + 0.4 * 17/20 = 0.44.
    assert one(HIST, "histogram_quantile(0.5, sum by (le) (h_bucket))", 0) == pytest.approx(0.44)
    assert math.isnan(one(HIST, "histogram_quantile(0.5, noinf_bucket)", 0))


# ---------------------------------------------------------------------------------------------
# Binary operators and vector matching


VEC = make_store(
    {
        'req{engine="0",kind="a"}': [10],
        'req{engine="1",kind="a"}': [20],
        'cap{engine="0"}': [100],
        'cap{engine="1"}': [50],
        'info{engine="0",model="m"}': [1],
        'info{engine="1",model="n"}': [1],
    }
)
VEC_MANY = make_store(
    {
        'req{engine="0",kind="a"}': [10],
        'req{engine="0",kind="b"}': [5],
        'req{engine="1",kind="a"}': [20],
        'cap{engine="0"}': [100],
        'cap{engine="1"}': [50],
    }
)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("req / on(engine) cap", {'{engine="0"}': 0.1, '{engine="1"}': 0.4}),
        ("req / ignoring(kind) cap", {'{engine="0"}': 0.1, '{engine="1"}': 0.4}),
        ("req / cap", {}),  # kind makes the label sets differ
        (
            "req * on(engine) group_left(model) info",
            {'{engine="0",kind="a",model="m"}': 10.0, '{engine="1",kind="a",model="n"}': 20.0},
        ),
        (
            "info * on(engine) group_right req",
            {'{engine="0",kind="a"}': 10.0, '{engine="1",kind="a"}': 20.0},
        ),
        ("req > 15", {'{__name__="req",engine="1",kind="a"}': 20.0}),
        ("15 < req", {'{__name__="req",engine="1",kind="a"}': 20.0}),
        ("req > bool 15", {'{engine="0",kind="a"}': 0.0, '{engine="1",kind="a"}': 1.0}),
        ("req * 2", {'{engine="0",kind="a"}': 20.0, '{engine="1",kind="a"}': 40.0}),
        ("100 - req", {'{engine="0",kind="a"}': 90.0, '{engine="1",kind="a"}': 80.0}),
        ("-req", {'{engine="0",kind="a"}': -10.0, '{engine="1",kind="a"}': -20.0}),
        ("cap > on(engine) req * 3", {'{engine="0"}': 100.0}),
        ("cap > bool on(engine) req * 3", {'{engine="0"}': 1.0, '{engine="1"}': 0.0}),
        ("cap == ignoring(kind) req", {}),
        (
            "req and on(engine) cap > 60",
            {'{__name__="req",engine="0",kind="a"}': 10.0},
        ),
        ("req unless on(engine) cap > 60", {'{__name__="req",engine="1",kind="a"}': 20.0}),
        ("req and cap", {}),
        (
            "req unless cap",
            {
                '{__name__="req",engine="0",kind="a"}': 10.0,
                '{__name__="req",engine="1",kind="a"}': 20.0,
            },
        ),
        (
            'cap{engine="0"} or on(engine) req',
            {'{__name__="cap",engine="0"}': 100.0, '{__name__="req",engine="1",kind="a"}': 20.0},
        ),
        (
            "cap or on(engine) req",
            {'{__name__="cap",engine="0"}': 100.0, '{__name__="cap",engine="1"}': 50.0},
        ),
        ('absent(req{engine="7"})', {'{engine="7"}': 1.0}),
        ('absent(req{engine="7",engine!="8"})', {"": 1.0}),
        ("absent(req)", {}),
        ("vector(3) + 1", {"": 4.0}),
        ("clamp_max(req, 15)", {'{engine="0",kind="a"}': 10.0, '{engine="1",kind="a"}': 15.0}),
        ("clamp_min(req, 15)", {'{engine="0",kind="a"}': 15.0, '{engine="1",kind="a"}': 20.0}),
        ("clamp(req, 12, 18)", {'{engine="0",kind="a"}': 12.0, '{engine="1",kind="a"}': 18.0}),
        ("clamp(req, 18, 12)", {}),
        ("abs(0 - req)", {'{engine="0",kind="a"}': 10.0, '{engine="1",kind="a"}': 20.0}),
        ("round(req / 3, 0.5)", {'{engine="0",kind="a"}': 3.5, '{engine="1",kind="a"}': 6.5}),
    ],
)
def test_binary_operators_and_matching(expr, expected):
    got = at(VEC, expr, 0)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value)


def test_scalar_results():
    assert evaluate("scalar(sum(req))", VEC, 0) == 30.0
    assert math.isnan(evaluate("scalar(req)", VEC, 0))  # not exactly one sample
    assert evaluate("time()", VEC, 90 * S) == 90.0
    assert evaluate("scalar(req{engine='0'}) * 2 + time()", VEC, 10 * S) == 30.0


def test_group_left_many_to_one_and_matching_errors():
    got = at(VEC_MANY, "req / on(engine) group_left cap", 0)
    assert got == {
        '{engine="0",kind="a"}': 0.1,
        '{engine="0",kind="b"}': 0.05,
        '{engine="1",kind="a"}': 0.4,
    }
    with pytest.raises(PromQLError, match="many-to-one matching must be explicit"):
        evaluate("req / on(engine) cap", VEC_MANY, 0)
    with pytest.raises(PromQLError, match="duplicate series for the match group"):
        evaluate("cap / on(engine) req", VEC_MANY, 0)
    with pytest.raises(PromQLError, match="same labelset"):
        evaluate('{__name__=~"req|cap"} * 1', make_store({"req": [1], "cap": [2]}), 0)


def test_aggregations():
    values = [10.0, 5.0, 20.0]
    assert at(VEC_MANY, "sum by (engine) (req)", 0) == {'{engine="0"}': 15.0, '{engine="1"}': 20.0}
    assert at(VEC_MANY, "sum without (kind) (req)", 0) == {
        '{engine="0"}': 15.0,
        '{engine="1"}': 20.0,
    }
    assert at(VEC_MANY, "sum(req)", 0) == {"": 35.0}
    assert at(VEC_MANY, "avg by (kind) (req)", 0) == {'{kind="a"}': 15.0, '{kind="b"}': 5.0}
    assert at(VEC_MANY, "count(req) by (engine)", 0) == {'{engine="0"}': 2.0, '{engine="1"}': 1.0}
    assert at(VEC_MANY, "max(req)", 0) == {"": 20.0}
    assert at(VEC_MANY, "min by (engine) (req)", 0) == {'{engine="0"}': 5.0, '{engine="1"}': 20.0}
    assert at(VEC_MANY, "group by (kind) (req)", 0) == {'{kind="a"}': 1.0, '{kind="b"}': 1.0}
    assert one(VEC_MANY, "stddev(req)", 0) == pytest.approx(statistics.pstdev(values))
    assert one(VEC_MANY, "stdvar(req)", 0) == pytest.approx(statistics.pvariance(values))
    assert one(VEC_MANY, "quantile(0.5, req)", 0) == 10.0
    assert one(VEC_MANY, "quantile(0.25, req)", 0) == 7.5
    assert at(VEC_MANY, "topk(1, req)", 0) == {'{__name__="req",engine="1",kind="a"}': 20.0}
    assert at(VEC_MANY, "bottomk by (engine) (1, req)", 0) == {
        '{__name__="req",engine="0",kind="b"}': 5.0,
        '{__name__="req",engine="1",kind="a"}': 20.0,
    }
    assert at(VEC_MANY, "topk(0, req)", 0) == {}
    assert at(VEC_MANY, "sum by (__name__) (req)", 0) == {'{__name__="req"}': 35.0}


def test_evaluate_rejects_range_results_and_returns_dict_labels():
    with pytest.raises(PromQLError, match="instant vector or a scalar"):
        evaluate("req[5m]", VEC, 0)
    result = evaluate('req{engine="0"}', VEC, 0)
    assert result == [({"__name__": "req", "engine": "0", "kind": "a"}, 10.0)]


# ---------------------------------------------------------------------------------------------
# Alert state machine


def rule(expr: str, for_s: float = 0.0, **kw) -> AlertRule:
    return AlertRule(alert=kw.pop("alert", "A"), expr=expr, for_s=for_s, group="g", **kw)


MINUTES = np.arange(11) * M


def test_for_pending_firing_resolution_and_flapping():
    #           0  1  2  3  4  5  6  7  8  9  10  (minutes)
    store = make_store({'q{engine="0"}': [0, 6, 7, 8, 9, 2, 2, 6, 2, 6, 2]})
    df = evaluate_alerts([rule("q > 5", for_s=120, labels={"severity": "page"})], store, MINUTES)
    assert list(df.columns[:6]) == [
        "alert",
        "labels",
        "pending_t_ns",
        "firing_t_ns",
        "resolved_t_ns",
        "max_value",
    ]
    # The metric name is dropped and the rule's labels added.
    assert set(df["labels"]) == {'{engine="0",severity="page"}'}
    rows = [
        (
            r.pending_t_ns,
            None if pd.isna(r.firing_t_ns) else r.firing_t_ns,
            r.resolved_t_ns,
            r.max_value,
        )
        for r in df.itertuples()
    ]
    assert rows == [
        (1 * M, 3 * M, 5 * M, 9.0),  # active from 1m; 3m - 1m >= for, so firing at 3m
        (7 * M, None, 8 * M, 6.0),  # active for one evaluation at a time: flapping never fires
        (9 * M, None, 10 * M, 6.0),
    ]
    assert df["alert"].tolist() == ["A", "A", "A"] and df["group"].tolist() == ["g"] * 3


def test_for_zero_fires_at_once_and_open_episodes_stay_unresolved():
    store = make_store({"q": [0, 6, 6, 6]})
    df = evaluate_alerts([rule("q > 5")], store, np.arange(4) * M)
    assert len(df) == 1
    row = df.iloc[0]
    assert row.pending_t_ns == row.firing_t_ns == 1 * M
    assert pd.isna(row.resolved_t_ns)


def test_instances_are_tracked_per_label_set():
    store = make_store({'q{engine="0"}': [6, 6, 6, 0], 'q{engine="1"}': [0, 6, 6, 6]})
    df = evaluate_alerts([rule("q > 5", for_s=60)], store, np.arange(4) * M)
    got = {r.labels: (r.pending_t_ns, r.firing_t_ns, r.resolved_t_ns) for r in df.itertuples()}
    assert got['{engine="0"}'] == (0, 1 * M, 3 * M)
    assert got['{engine="1"}'][:2] == (1 * M, 2 * M) and pd.isna(got['{engine="1"}'][2])


def test_keep_firing_for_and_timeline():
    store = make_store({"q": [0, 6, 6, 6, 0, 0, 0]})
    r = rule("q > 5", for_s=120, keep_firing_for_s=60)
    df = evaluate_alerts([r], store, np.arange(7) * M)
    assert len(df) == 1
    # Firing at 3m; absent from 4m, held for keep_firing_for (60 s), resolved at 5m.
    assert (df.iloc[0].pending_t_ns, df.iloc[0].firing_t_ns, df.iloc[0].resolved_t_ns) == (
        1 * M,
        3 * M,
        5 * M,
    )
    tl = alert_timeline([r], store, np.arange(7) * M)
    assert tl["t_ns"].tolist() == [1 * M, 2 * M, 3 * M, 4 * M]
    assert tl["state"].tolist() == ["pending", "pending", "firing", "firing"]
    assert tl["value"].tolist() == [6.0, 6.0, 6.0, 6.0]


def test_replica_death_resolves_at_the_scrape_it_vanishes_from():
    # Replica 1's series vanish from the 3m scrape on: stale at once, not after 5m of lookback.
    store = make_store({'up{engine="0"}': [1] * 6, 'up{engine="1"}': [1, 1, 1, None, None, None]})
    rules = [
        rule("up > 0", alert="Up"),
        rule('absent(up{engine="1"})', for_s=60, alert="EngineGone", labels={"team": "x"}),
    ]
    df = evaluate_alerts(rules, store, np.arange(6) * M)
    got = {
        (r.alert, r.labels): (r.pending_t_ns, r.firing_t_ns, r.resolved_t_ns)
        for r in df.itertuples()
    }
    assert got[("Up", '{engine="1"}')] == (0, 0, 3 * M)
    assert got[("EngineGone", '{engine="1",team="x"}')][:2] == (3 * M, 4 * M)


def test_alert_evaluation_errors_name_the_rule():
    store = make_store({'q{a="1"}': [1], 'r{a="1"}': [1]})
    with pytest.raises(PromQLError, match=r"alert 'Dup' \(group 'g'\) at t_ns=0: .*same labelset"):
        evaluate_alerts([rule('{__name__=~"q|r"}', alert="Dup")], store, [0])


def test_scalar_expressions_and_default_evaluation_times():
    store = make_store({"q": [1, 1, 1]})
    df = evaluate_alerts([rule("scalar(q) > bool 0")], store)  # every 1m from first to last scrape
    assert len(df) == 1 and df.iloc[0].labels == "" and df.iloc[0].firing_t_ns == 0
    assert pd.isna(df.iloc[0].resolved_t_ns)
    assert evaluate_alerts([], store).empty


# ---------------------------------------------------------------------------------------------
# Rule files

GOOD_RULES = """
groups:
  - name: capacity
    interval: 30s
    rules:
      - alert: QueueBuilding
        expr: sum by (engine) (vllm:num_requests_waiting) > 10
        for: 2m
        keep_firing_for: 1m
        labels: {severity: warning}
        annotations:
          summary: "Queue above 10 on {{ $labels.engine }}"
      - alert: EngineDown
        expr: absent(up{job="vllm"})
        for: 0
  - name: latency
    rules:
      - alert: SlowFirstToken
        expr: |
          histogram_quantile(0.99,
            sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m]))) > 2
"""


def test_load_rules_accepts_a_valid_file(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(GOOD_RULES)
    rules = load_rules(path)
    assert [r.alert for r in rules] == ["QueueBuilding", "EngineDown", "SlowFirstToken"]
    first = rules[0]
    assert (first.group, first.for_s, first.keep_firing_for_s, first.interval_s) == (
        "capacity",
        120.0,
        60.0,
        30.0,
    )
    assert first.labels == {"severity": "warning"}
    assert "$labels.engine" in first.annotations["summary"]
    assert rules[1].for_s == 0.0 and rules[2].interval_s is None
    assert selected_metrics(rules[2].node) == {"vllm:time_to_first_token_seconds_bucket"}
    assert load_rules(yaml.safe_load(GOOD_RULES)) == rules


BAD_RULE_FILES = [
    ("groups: [{name: g, rules: [{alert: A}]}]", "group 'g', rule 1 (alert 'A'): field 'expr'"),
    (
        "groups: [{name: g, rules: [{alert: A, expr: up, for: 5 min}]}]",
        "group 'g', rule 1 (alert 'A'): for: '5 min' is not a valid duration",
    ),
    ("groups: [{name: g, rules: [{alert: A, expr: up, for: 300}]}]", "300 is not a valid duration"),
    (
        "groups: [{name: g, rules: [{alert: A, expr: 'rate(up[5m)'}]}]",
        "group 'g', rule 1 (alert 'A'): expr: expected \"]\" to close the range selector",
    ),
    (
        "groups: [{name: g, rules: [{alert: A, expr: 'up[5m]'}]}]",
        "must be an instant vector or scalar",
    ),
    (
        "groups: [{name: g, rules: [{alert: A, expr: up}, {alert: A, expr: up}]}]",
        "group 'g', rule 2 (alert 'A'): duplicate alert name in the group (also rule 1)",
    ),
    (
        "groups: [{name: g, rules: [{alert: A, expr: up, labels: {team: 1}}]}]",
        "labels 'team' must be a string",
    ),
    (
        "groups: [{name: g, rules: [{alert: A, expr: up, labels: {bad-name: x}}]}]",
        "invalid labels name 'bad-name'",
    ),
    (
        "groups: [{name: g, rules: [{alert: A, expr: up, annotations: {9x: y}}]}]",
        "invalid annotations name '9x'",
    ),
    (
        "groups: [{name: g, rules: [{alert: A, expresion: up}]}]",
        "group 'g', rule 1 (alert 'A'): unknown field(s) expresion",
    ),
    ("groups: [{name: g, rules: [{record: 'a:b', expr: up}]}]", "recording rules are not"),
    ("groups: [{name: g, rules: [{alert: A, record: b, expr: up}]}]", "only one of 'record'"),
    ("groups: [{name: g, rules: [{expr: up}]}]", "'alert' must be set"),
    ("groups: [{name: g, rules: []}, {name: g, rules: []}]", "group 'g': group name repeated"),
    ("groups: [{rules: []}]", "group 1: 'name' must be a non-empty string"),
    ("groups: [{name: g, interval: soon, rules: []}]", "group 'g': interval: 'soon'"),
    ("groups: [{name: g, limit: 5, rules: []}]", "'limit' is not supported"),
    ("groups: [{name: g, rule: []}]", "group 'g': unknown field(s) rule"),
    ("group: []", "unknown top-level field(s) group"),
    ("groups: [{name: g, name: h, rules: []}]", "duplicate key 'name'"),
    ("- just a list", "must be a mapping with a 'groups' list"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_RULE_FILES)
def test_rule_file_validation_errors(tmp_path, text, fragment):
    path = tmp_path / "rules.yml"
    path.write_text(text)
    with pytest.raises(RuleFileError) as info:
        load_rules(path)
    assert fragment in str(info.value)


def test_rule_file_errors_are_all_reported():
    doc = {
        "groups": [
            {"name": "g", "rules": [{"alert": "A", "expr": "up >"}, {"alert": "B", "for": "x"}]}
        ]
    }
    with pytest.raises(RuleFileError) as info:
        load_rules(doc)
    errors = info.value.errors
    assert any("rule 1 (alert 'A'): expr:" in e and "position 4" in e for e in errors)
    assert any("rule 2 (alert 'B'): field 'expr'" in e for e in errors)
    assert any("rule 2 (alert 'B'): for: 'x'" in e for e in errors)


# ---------------------------------------------------------------------------------------------
# promtool: Prometheus itself as the reference


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_promtool_check_rules_accepts_what_the_loader_accepts(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(GOOD_RULES)
    assert len(load_rules(path)) == 3
    proc = run_promtool("check", "rules", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 3 rules found" in proc.stdout


@needs_promtool
@pytest.mark.parametrize(
    "text",
    [
        "groups: [{name: g, rules: [{alert: A, expr: 'rate(up[5m)'}]}]",
        "groups: [{name: g, rules: [{alert: A, expr: up, for: 5 min}]}]",
        "groups: [{name: g, rules: [{alert: A, expresion: up}]}]",
        "groups: [{name: g, rules: [{alert: A, expr: up, labels: {bad-name: x}}]}]",
        "groups: [{name: g, rules: []}, {name: g, rules: []}]",
        "groups: [{name: g, rules: [{alert: A, expr: '1 > 2'}]}]",
    ],
)
def test_promtool_check_rules_rejects_what_the_loader_rejects(tmp_path, text):
    path = tmp_path / "rules.yml"
    path.write_text(text)
    with pytest.raises(RuleFileError):
        load_rules(path)
    proc = run_promtool("check", "rules", str(path), cwd=tmp_path)
    assert proc.returncode != 0, proc.stdout


# Sixteen scrapes one minute apart: counters with a reset, a replica that dies and restarts from
# zero, one that dies for good, a histogram. None = absent from that scrape.
N_SCRAPES = 16


def vals(text: str) -> list[float | None]:
    """Space-separated values, "_" for absent from that scrape."""
    return [None if x == "_" else float(x) for x in text.split()]


DRILL = {
    'http_total{instance="a",job="api"}': vals("0 10 20 30 5 15 25 35 45 55 65 75 85 95 105 115"),
    'http_total{instance="b",job="api"}': vals("_ _ _ 50 60 70 80 _ _ 0 12 24 36 48 60 72"),
    'queue{engine="0"}': vals("0 1 3 5 6 7 6 2 1 5 6 6 7 2 1 0"),
    'queue{engine="1"}': vals("1 2 2 3 4 4 5 5 _ _ _ _ _ _ _ _"),
    'info{engine="0",model="m"}': [1.0] * N_SCRAPES,
    'info{engine="1",model="n"}': [1.0] * N_SCRAPES,
    'lat_bucket{le="0.1"}': [5.0 * i for i in range(N_SCRAPES)],
    'lat_bucket{le="0.5"}': [8.0 * i for i in range(N_SCRAPES)],
    'lat_bucket{le="+Inf"}': [10.0 * i for i in range(N_SCRAPES)],
}


def promtool_values(values: list[float | None]) -> str:
    """Our absent-from-a-scrape is promtool's 'stale' (then '_' until the series returns)."""
    out, present = [], False
    for v in values:
        if v is None:
            out.append("stale" if present else "_")
        else:
            out.append(repr(float(v)))
        present = v is not None
    return " ".join(out)


def promtool_series() -> list[dict[str, str]]:
    return [{"series": k, "values": promtool_values(v)} for k, v in DRILL.items()]


DRILL_RULES = """
groups:
  - name: drill
    rules:
      - alert: QueueHigh
        expr: queue > 4
        for: 2m
        labels: {severity: warning}
        annotations: {summary: queue above 4}
      - alert: RequestRateHigh
        expr: sum by (job) (rate(http_total[5m])) > 0.25
        for: 1m
      - alert: EngineAbsent
        expr: absent(queue{engine="1"})
      - alert: EngineBusy
        expr: queue{engine="1"} > 2
        for: 1m
        keep_firing_for: 3m
      - alert: SlowTail
        expr: histogram_quantile(0.85, sum by (le) (rate(lat_bucket[3m]))) >= 0.5
  - name: matching
    interval: 1m
    rules:
      - alert: ModelQueue
        expr: queue * on(engine) group_left(model) info > 5 unless on(engine) queue < 6.5
        labels: {team: serving}
"""


@needs_promtool
def test_promtool_test_rules_agrees_on_firing_alerts(tmp_path):
    (tmp_path / "rules.yml").write_text(DRILL_RULES)
    rules = load_rules(tmp_path / "rules.yml")
    store = make_store(DRILL)
    times = np.arange(N_SCRAPES) * M
    timeline = alert_timeline(rules, store, times)
    firing = timeline[timeline["state"] == "firing"]
    # Every rule fires at some point and is silent at another, so agreement is not vacuous.
    assert set(firing["alert"]) == {r.alert for r in rules}
    for r in rules:
        assert len(firing[firing["alert"] == r.alert]["t_ns"].unique()) < N_SCRAPES
    cases = []
    for r in rules:
        for i, t in enumerate(times):
            rows = firing[(firing["alert"] == r.alert) & (firing["t_ns"] == t)]
            cases.append(
                {
                    "eval_time": f"{i}m",
                    "alertname": r.alert,
                    "exp_alerts": [
                        {"exp_labels": parse_labels(lab), "exp_annotations": dict(r.annotations)}
                        for lab in rows["labels"]
                    ],
                }
            )
    unit = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": promtool_series(), "alert_rule_test": cases}],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    proc = run_promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr
    # And the episodes agree with the timeline (EngineBusy held 3m by keep_firing_for).
    episodes = evaluate_alerts(rules, store, times)
    busy = episodes[episodes["alert"] == "EngineBusy"].iloc[0]
    assert (busy.pending_t_ns, busy.firing_t_ns, busy.resolved_t_ns) == (3 * M, 4 * M, 11 * M)


DIFFERENTIAL_EXPRS = [
    "http_total",
    "rate(http_total[5m])",
    "increase(http_total[3m])",
    "irate(http_total[5m])",
    "resets(http_total[10m])",
    "rate(http_total[5m] offset 2m)",
    "sum by (job) (rate(http_total[5m]))",
    "sum without (instance) (http_total)",
    "idelta(queue[5m])",
    "delta(queue[4m])",
    "deriv(queue[5m])",
    "max_over_time(queue[3m])",
    "min_over_time(queue[3m])",
    "avg_over_time(queue[3m])",
    "sum_over_time(queue[3m])",
    "count_over_time(queue[10m])",
    "last_over_time(queue[3m])",
    "stddev_over_time(queue[5m])",
    "quantile_over_time(0.3, queue[5m])",
    "changes(queue[5m])",
    "histogram_quantile(0.9, rate(lat_bucket[5m]))",
    "histogram_quantile(0.5, sum by (le) (rate(lat_bucket[5m])))",
    "histogram_quantile(0.3, lat_bucket)",
    "avg(queue)",
    "max(queue)",
    "count(queue)",
    "stddev(queue)",
    "topk(1, queue)",
    "quantile(0.5, queue)",
    "queue > 3",
    "queue > bool 3",
    "3 < queue",
    "2 - queue * 2",
    "-queue",
    "queue / on(engine) group_left(model) info",
    "info * on(engine) group_right queue",
    "queue + ignoring(model) info",
    "queue > on(engine) info",
    "queue and on(engine) info",
    'queue unless on(engine) info{model="m"}',
    "queue or info",
    'absent(queue{engine="9"})',
    "absent(queue)",
    'absent_over_time(queue{engine="1"}[2m])',
    "scalar(sum(queue)) * 2",
    "time()",
    "clamp(queue, 2, 5)",
    "round(queue / 3, 0.5)",
    "queue offset 2m",
    'http_total{instance=~"a|b", job!~"x.*"}',
    '{__name__=~"queue|info", engine="0"}',
    "queue % 4 ^ 2",
    "sum(rate(http_total[5m])) / sum(rate(lat_bucket{le='+Inf'}[5m]))",
]
DIFFERENTIAL_MINUTES = [3, 5, 7, 8, 9, 10, 12, 15]
_GOT_BLOCK = re.compile(r'expr: "(.*)", time: (\d+)m,\n\s*exp: .*\n\s*got: (.*)\n')
_GOT_SAMPLE = re.compile(r"(\{[^}]*\}) (\S+?)(?:, |$)")


@needs_promtool
def test_promtool_promql_values_agree(tmp_path):
    """Every expression at every time, against Prometheus' engine via promtool.

    Expected samples are left empty, so promtool reports what it got for each non-empty result;
    those reports are parsed and compared with ours.
    """
    cases = [
        {"expr": e, "eval_time": f"{m}m", "exp_samples": []}
        for e in DIFFERENTIAL_EXPRS
        for m in DIFFERENTIAL_MINUTES
    ]
    unit = {
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": promtool_series(), "promql_expr_test": cases}],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    proc = run_promtool("test", "rules", "test.yml", cwd=tmp_path)
    output = proc.stdout + proc.stderr
    theirs: dict[tuple[str, int], dict[str, float]] = {}
    for block in _GOT_BLOCK.finditer(output):
        expr = block.group(1).replace('\\"', '"')
        samples = {
            format_labels(parse_labels(s.group(1))): float(s.group(2))
            for s in _GOT_SAMPLE.finditer(block.group(3))
        }
        theirs[(expr, int(block.group(2)))] = samples
    assert len(theirs) > len(cases) // 2, output[:2000]
    store = make_store(DRILL)
    mismatches = []
    for expr in DIFFERENTIAL_EXPRS:
        for minute in DIFFERENTIAL_MINUTES:
            result = evaluate(expr, store, minute * M)
            if isinstance(result, float):
                mine = {"": result}
            else:
                mine = {format_labels(labels): value for labels, value in result}
            ref = theirs.get((expr, minute), {})
            same = mine.keys() == ref.keys() and all(
                (math.isnan(mine[k]) and math.isnan(ref[k]))
                or math.isclose(mine[k], ref[k], rel_tol=1e-9, abs_tol=1e-12)
                for k in mine
            )
            if not same:
                mismatches.append(f"{expr} at {minute}m: ours {mine}, promtool {ref}")
    assert not mismatches, "\n".join(mismatches)


# ---------------------------------------------------------------------------------------------
# Scale


def test_store_scales_to_a_drill():
    rng = np.random.default_rng(7)
    n_scrapes, n_series = 100, 2000
    names = [f"vllm:metric_{i % 20}" for i in range(n_series)]
    labels = [f'{{engine="{(i // 20) % 8}",idx="{i}"}}' for i in range(n_series)]
    frame = pd.DataFrame(
        {
            "t_ns": np.repeat(np.arange(n_scrapes) * 5 * S, n_series),
            "metric": names * n_scrapes,
            "labels": labels * n_scrapes,
            "value": rng.random(n_scrapes * n_series).cumsum(),
        }
    )
    # Engine 7 dies halfway through the drill.
    dead = (frame["labels"].str.contains('engine="7"')) & (frame["t_ns"] >= 50 * 5 * S)
    frame = frame[~dead]
    store = SeriesStore.from_frame(frame, np.arange(n_scrapes) * 5 * S)
    assert store.series_count == n_series
    expr = parse("sum by (engine) (rate(vllm:metric_3[1m])) > 0")
    start = time.perf_counter()
    results = [evaluate(expr, store, t) for t in np.arange(12, n_scrapes) * 5 * S]
    elapsed = time.perf_counter() - start
    assert {tuple(sorted(d["engine"] for d, _ in r)) for r in results[:30]} == {
        tuple(str(e) for e in range(8))
    }
    assert all("7" not in {d["engine"] for d, _ in r} for r in results[-20:])
    assert elapsed < 5.0
