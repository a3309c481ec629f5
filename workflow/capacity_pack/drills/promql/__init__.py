"""A PromQL subset and Prometheus alerting-rule evaluation over the scrapes of a load test.

The pack ships Prometheus alerting rules for the servers' metrics. To say which of those alerts
would have fired during a drill, and when, the drills evaluate the *same* rule files over the
series the load generator scraped, with Prometheus' semantics rather than an approximation:

    rules = load_rules("alerts.yml")
    store = SeriesStore.from_frame(samples, scrape_t_ns)   # t_ns, metric, labels, value
    episodes = evaluate_alerts(rules, store, scrape_t_ns)  # one row per pending..resolved

Modules, in the order data flows through them:

==============  ==================================================================================
``errors``      :class:`PromQLError` (with position), :class:`RuleFileError` (all problems)
``labels``      label sets and their exposition-format text
``lexer``       durations and tokens
``nodes``       the syntax tree; tables of functions, aggregations, operator precedence
``parser``      :func:`parse` (recursive descent, Prometheus' parse-time type checks)
``store``       :class:`SeriesStore`: series indexed per metric, staleness markers
``functions``   range-vector functions (rate/increase extrapolation), histogram_quantile, ...
``binary``      binary operators and vector matching
``evaluator``   :func:`evaluate` at one time: selectors with lookback, dispatch
``rules``       :func:`load_rules`: rule files checked as ``promtool check rules`` does
``alerts``      :func:`evaluate_alerts`, :func:`alert_timeline`: the ``for:`` state machine
==============  ==================================================================================

The supported subset: number literals, selectors with ``= != =~ !~`` matchers, ranges, offset,
the functions in :data:`FUNCTIONS`, the aggregations in :data:`AGGREGATIONS`, every binary
operator with ``bool``, ``on``/``ignoring`` and ``group_left``/``group_right``. Subqueries, ``@``,
``count_values``, other functions and string-valued expressions are rejected at parse time;
so are recording rules and group ``limit`` in rule files.

Why an evaluator of our own: no maintained Python library evaluates PromQL. On PyPI,
``promql-parser`` (bindings of GreptimeDB's Rust parser) parses and does not evaluate; the other
PromQL packages (``promcraft``, ``promql-builder``, ``pypromql``, ``promql-http-api``, ...) build
query strings or query a running Prometheus over HTTP. Prometheus itself evaluates rules only in a
server that has ingested the series, or in ``promtool test rules``, which needs the Go binary at
run time, the series rewritten in its notation, and reports alerts only at the evaluation times a
test file lists. So the drills use this package, and ``tests/unit/drills/test_promql.py``
and ``tests/unit/drills/test_dashboard.py`` compare it with ``promtool`` wherever Debian's
``prometheus`` package is installed.
"""

from __future__ import annotations

from capacity_pack.drills.promql.alerts import (
    DEFAULT_EVAL_INTERVAL_NS,
    alert_timeline,
    evaluate_alerts,
)
from capacity_pack.drills.promql.errors import PromQLError, RuleFileError
from capacity_pack.drills.promql.evaluator import DEFAULT_LOOKBACK_NS, evaluate
from capacity_pack.drills.promql.labels import Labels, format_labels, parse_labels
from capacity_pack.drills.promql.lexer import NS_PER_S, parse_duration
from capacity_pack.drills.promql.nodes import (
    AGGREGATIONS,
    FUNCTIONS,
    MATRIX,
    SCALAR,
    VECTOR,
    Aggregation,
    BinaryOp,
    Call,
    FunctionSpec,
    LabelMatcher,
    MatrixSelector,
    Node,
    NumberLiteral,
    Paren,
    UnaryOp,
    VectorMatching,
    VectorSelector,
)
from capacity_pack.drills.promql.parser import parse, selected_metrics
from capacity_pack.drills.promql.rules import AlertRule, load_rules
from capacity_pack.drills.promql.store import SeriesStore

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_EVAL_INTERVAL_NS",
    "DEFAULT_LOOKBACK_NS",
    "FUNCTIONS",
    "MATRIX",
    "NS_PER_S",
    "SCALAR",
    "VECTOR",
    "Aggregation",
    "AlertRule",
    "BinaryOp",
    "Call",
    "FunctionSpec",
    "LabelMatcher",
    "Labels",
    "MatrixSelector",
    "Node",
    "NumberLiteral",
    "Paren",
    "PromQLError",
    "RuleFileError",
    "SeriesStore",
    "UnaryOp",
    "VectorMatching",
    "VectorSelector",
    "alert_timeline",
    "evaluate",
    "evaluate_alerts",
    "format_labels",
    "load_rules",
    "parse",
    "parse_duration",
    "parse_labels",
    "selected_metrics",
]
