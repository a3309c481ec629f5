"""Prometheus rule files, validated the way ``promtool check rules`` does.

The file format is Prometheus' (see
https://prometheus.io/docs/prometheus/latest/configuration/recording_rules/ and
https://prometheus.io/docs/prometheus/latest/configuration/alerting_rules/): ``groups`` of
``name``, optional ``interval`` and ``limit``, and ``rules``, each with ``alert``, ``expr``,
``for``, ``keep_firing_for``, ``labels`` and ``annotations``.

:func:`load_rules` checks required and unknown fields, durations, expressions (parsed and
type-checked: an alert's ``expr`` must be an instant vector or a scalar), label and annotation
names, string values and unique group names, as promtool does. It also rejects what this
evaluator cannot honour or what would merge alerts: duplicate alert names within a group,
duplicate YAML keys (Prometheus' YAML decoding rejects them too), recording rules and a non-zero
``limit``. Every error names the group, the rule and the problem, and all are reported together
(:class:`RuleFileError`). Label and annotation templates are kept as text, not expanded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from capacity_pack.drills.promql.errors import PromQLError, RuleFileError
from capacity_pack.drills.promql.labels import LABEL_NAME_RE
from capacity_pack.drills.promql.lexer import NS_PER_S, parse_duration
from capacity_pack.drills.promql.nodes import SCALAR, VECTOR, Node
from capacity_pack.drills.promql.parser import parse


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule, validated; ``node`` is the parsed ``expr``."""

    alert: str
    expr: str
    for_s: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    group: str = ""
    keep_firing_for_s: float = 0.0
    interval_s: float | None = None
    node: Node = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.node is None:
            object.__setattr__(self, "node", parse(self.expr))

    @property
    def for_ns(self) -> int:
        return round(self.for_s * NS_PER_S)

    @property
    def keep_firing_for_ns(self) -> int:
        return round(self.keep_firing_for_s * NS_PER_S)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys, as Prometheus' YAML decoding does."""


def _construct_unique_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)

_GROUP_FIELDS = {"name", "interval", "rules", "limit"}
_RULE_FIELDS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


def _duration_field(value: Any, what: str, errors: list[str], where: str) -> float:
    # YAML reads "for: 0" as an int; Prometheus accepts it (and only it) without a unit.
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(text, str):
        try:
            return parse_duration(text) / NS_PER_S
        except ValueError:
            pass
    errors.append(f"{where}: {what}: {value!r} is not a valid duration (e.g. 30s, 5m, 1h30m)")
    return 0.0


def _string_map(value: Any, what: str, errors: list[str], where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors.append(f"{where}: {what} must be a mapping of names to strings")
        return {}
    out = {}
    for key, val in value.items():
        if not isinstance(key, str) or not LABEL_NAME_RE.fullmatch(key):
            errors.append(f"{where}: invalid {what} name {key!r}")
        elif what == "labels" and key == "__name__":
            errors.append(f"{where}: labels must not set __name__")
        elif not isinstance(val, str):
            errors.append(f"{where}: {what} {key!r} must be a string, got {val!r}")
        else:
            out[key] = val
    return out


def _validate_rule(
    rule: Any, where: str, group: str, interval_s: float | None, errors: list[str]
) -> AlertRule | None:
    if not isinstance(rule, Mapping):
        errors.append(f"{where}: a rule must be a mapping")
        return None
    alert = rule.get("alert")
    if isinstance(alert, str) and alert:
        where = f"{where} (alert {alert!r})"
    before = len(errors)
    unknown = sorted(map(str, set(rule) - _RULE_FIELDS))
    if unknown:
        errors.append(f"{where}: unknown field(s) {', '.join(unknown)}")
    if "record" in rule and "alert" in rule:
        errors.append(f"{where}: only one of 'record' and 'alert' may be set")
        return None
    if "record" in rule:
        errors.append(f"{where}: recording rules are not supported by this evaluator")
        return None
    if not isinstance(alert, str) or not alert.strip():
        errors.append(f"{where}: 'alert' must be set to a non-empty string")
    expr = rule.get("expr")
    node = None
    if expr is None or (isinstance(expr, str) and not expr.strip()):
        errors.append(f"{where}: field 'expr' must be set")
    elif not isinstance(expr, str):
        errors.append(f"{where}: 'expr' must be a string, got {expr!r}")
    else:
        try:
            node = parse(expr)
            if node.type not in (SCALAR, VECTOR):
                raise PromQLError(
                    f"expression must be an instant vector or scalar, not {node.type}"
                )
        except PromQLError as err:
            errors.append(f"{where}: expr: {err}")
    for_s = _duration_field(rule.get("for", "0"), "for", errors, where)
    keep_s = _duration_field(rule.get("keep_firing_for", "0"), "keep_firing_for", errors, where)
    labels = _string_map(rule.get("labels"), "labels", errors, where)
    annotations = _string_map(rule.get("annotations"), "annotations", errors, where)
    if len(errors) > before or node is None:
        return None
    return AlertRule(
        alert=alert,
        expr=expr,
        for_s=for_s,
        labels=labels,
        annotations=annotations,
        group=group,
        keep_firing_for_s=keep_s,
        interval_s=interval_s,
        node=node,
    )


def load_rules(source: str | Path | Mapping[str, Any]) -> list[AlertRule]:
    """Alerting rules of a Prometheus rule file (a path, or the already-loaded mapping).

    Raises :class:`RuleFileError` listing every problem, each naming group, rule and problem.
    """
    if isinstance(source, Mapping):
        origin, doc = "rule file", source
    else:
        origin = str(source)
        try:
            doc = yaml.load(Path(source).read_text(), Loader=_StrictLoader)
        except yaml.YAMLError as err:
            raise RuleFileError(origin, [f"invalid YAML: {err}"]) from None
    errors: list[str] = []
    rules: list[AlertRule] = []
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise RuleFileError(origin, ["the file must be a mapping with a 'groups' list"])
    unknown = sorted(map(str, set(doc) - {"groups"}))
    if unknown:
        errors.append(f"unknown top-level field(s) {', '.join(unknown)}")
    groups = doc.get("groups") or []
    if not isinstance(groups, list):
        raise RuleFileError(origin, [*errors, "'groups' must be a list"])
    names: set[str] = set()
    for gi, group in enumerate(groups):
        rules.extend(_group_rules(group, f"group {gi + 1}", names, errors))
    if errors:
        raise RuleFileError(origin, errors)
    return rules


def _group_rules(group: Any, where: str, names: set[str], errors: list[str]) -> list[AlertRule]:
    """The valid alerting rules of one group; its problems go to ``errors``.

    ``names`` holds the group names seen so far in the file (this one is added).
    """
    if not isinstance(group, Mapping):
        errors.append(f"{where}: a group must be a mapping")
        return []
    name = group.get("name")
    if not isinstance(name, str) or not name:
        errors.append(f"{where}: 'name' must be a non-empty string")
        name = ""
    else:
        where = f"group {name!r}"
        if name in names:
            errors.append(f"{where}: group name repeated in the same file")
        names.add(name)
    unknown = sorted(map(str, set(group) - _GROUP_FIELDS))
    if unknown:
        errors.append(f"{where}: unknown field(s) {', '.join(unknown)}")
    interval_s = None
    if group.get("interval") is not None:
        interval_s = _duration_field(group["interval"], "interval", errors, where) or None
    limit = group.get("limit", 0)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        errors.append(f"{where}: 'limit' must be a non-negative integer")
    elif limit:
        errors.append(f"{where}: 'limit' is not supported by this evaluator")
    group_rules = group.get("rules") or []
    if not isinstance(group_rules, list):
        errors.append(f"{where}: 'rules' must be a list")
        return []
    rules: list[AlertRule] = []
    seen: dict[str, int] = {}
    for ri, rule in enumerate(group_rules):
        rwhere = f"{where}, rule {ri + 1}"
        parsed = _validate_rule(rule, rwhere, name, interval_s, errors)
        alert = rule.get("alert") if isinstance(rule, Mapping) else None
        if isinstance(alert, str) and alert:
            if alert in seen:
                errors.append(
                    f"{rwhere} (alert {alert!r}): duplicate alert name in the group "
                    f"(also rule {seen[alert]})"
                )
                continue
            seen[alert] = ri + 1
        if parsed is not None:
            rules.append(parsed)
    return rules
