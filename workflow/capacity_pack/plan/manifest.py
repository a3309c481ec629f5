"""The pack manifest: one pydantic schema, validation, and the canonical frozen form.

This module holds the :class:`Pack` (the ``pack`` section and the checks across sections),
loading, validation errors, freezing and the JSON schema; the models of the other sections live
beside it (the names importers outside plan/ use are re-exported here): ``section`` (the base
model), ``lengths`` (token-length distributions), ``system`` (``model``, ``engine``,
``target``), ``client``, ``workload`` (``request``, ``prompts``, ``workload``, ``acceptance``,
``report``), ``sweep`` (and ``experiments``), ``sizing`` (``plan``) and ``failure``, each
``capacity_pack.plan.<name>``.

Formulas: weighted mean tokens = sum_c mix_c * E[tokens_c]; class schedule counts by largest
remainder over n * mix_c (ties by class order), so they sum to n exactly.

:func:`freeze` validates, refuses mutable revisions, hashes referenced data files in, and gives
the canonical document with a sha256 of the whole and of each top-level section (the Snakefile
hashes the same sections into rule ``params``). Input hygiene: UTF-8 YAML without duplicate
keys (:mod:`capacity_pack.plan.yamlfile`), a mapping at the top, ``cutoff`` a date, numbers
finite and bounded (:mod:`capacity_pack.plan.limits`), at most ``MAX_REQUESTS`` requests per
point and an open-loop point's initial requests within ``MAX_DURATION_S``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from capacity_pack import __version__
from capacity_pack.errors import StatedError
from capacity_pack.io import sha256_of_obj
from capacity_pack.plan.client import Client
from capacity_pack.plan.failure import (
    PLAN_DRILL,
    Drill,
    Failure,
    PlanDrill,
)
from capacity_pack.plan.lengths import (
    length_stats,
    sample_lengths,
)
from capacity_pack.plan.limits import (
    MAX_DURATION_S,
    MAX_REQUESTS,
    MIN_OPEN_LOOP_RPS,
    is_mutable_revision,
)
from capacity_pack.plan.section import (
    SLUG_PATTERN,
    Section,
)
from capacity_pack.plan.sizing import Plan
from capacity_pack.plan.sweep import (
    K6_TEST_TYPES,
    ConcurrencySearch,
    Experiment,
    Segment,
    Sweep,
    judged_by_engine_model,
    search_rate_bounds,
)
from capacity_pack.plan.system import (
    Engine,
    Model,
    OpenAITarget,
    SimTarget,
)
from capacity_pack.plan.workload import (
    Acceptance,
    Prompts,
    Report,
    RequestShape,
    WorkloadClass,
)
from capacity_pack.plan.yamlfile import TextInputError, decode_utf8, parse_yaml, shorten

# Section models that modules outside plan/ (drills, twin, decide, stages) import from here.
__all__ = [
    "K6_TEST_TYPES",
    "PLAN_DRILL",
    "Acceptance",
    "Client",
    "ConcurrencySearch",
    "Drill",
    "Experiment",
    "Failure",
    "OpenAITarget",
    "PlanDrill",
    "Segment",
    "SimTarget",
    "WorkloadClass",
    "judged_by_engine_model",
    "length_stats",
    "sample_lengths",
    "search_rate_bounds",
]

FROZEN_FORMAT = "capacity-pack/frozen-manifest/v1"

SECTIONS = (
    "pack",
    "cutoff",
    "model",
    "engine",
    "client",
    "request",
    "prompts",
    "workload",
    "acceptance",
    "target",
    "sweep",
    "experiments",
    "plan",
    "report",
    "failure",
)


class ManifestError(StatedError, ValueError):
    """A pack configuration that cannot be used; the message names the file and field."""


class PackInfo(Section):
    name: str = Field(pattern=SLUG_PATTERN, description="Pack id; names results/<name>/.")
    title: str = Field(description="Human title shown in reports.")
    size: Literal["rehearsal", "full"] = Field(
        description="'rehearsal' marks a scaled-down pack whose numbers are not a capacity claim."
    )
    description: str = Field(default="", description="What this pack is for.")

    @property
    def label(self) -> str:
        if self.size == "rehearsal":
            return "REHEARSAL-SIZE PACK: scaled-down sample sizes; not a capacity claim"
        return "FULL-SIZE PACK"


class Pack(Section):
    """A complete, validated pack definition."""

    pack: PackInfo
    cutoff: date = Field(description="Date the manifest was frozen for.")
    model: Model
    engine: Engine
    client: Client
    request: RequestShape = Field(default_factory=RequestShape)
    prompts: Prompts
    workload: list[WorkloadClass] = Field(min_length=1)
    acceptance: Acceptance
    target: Annotated[SimTarget | OpenAITarget, Field(discriminator="kind")]
    sweep: Sweep
    experiments: list[Experiment] = Field(default_factory=list)
    plan: Plan
    report: Report = Field(default_factory=Report)
    failure: Failure | None = Field(
        default=None, description="Failure drills (none: the pack runs no drill)."
    )

    @field_validator("cutoff", mode="before")
    @classmethod
    def _iso_date(cls, value: Any) -> Any:
        # pydantic's lax dates take 0 as 1970-01-01 and a date-time with a zero time as its day.
        if isinstance(value, date) and not isinstance(value, datetime):
            return value
        if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            return value
        raise ValueError(f"expected a date as YYYY-MM-DD, not {type(value).__name__}")

    @model_validator(mode="after")
    def _predicted_search(self) -> Pack:
        """Only a simulated target is predicted before it is measured (its own profile)."""
        search = self.sweep.search
        if search is not None and search.initial == "predicted" and self.target.kind != "sim":
            raise ValueError(
                "sweep.search.initial 'predicted' starts from the preflight prediction, which "
                "needs an engine model: target.kind sim (a real target has none before it is "
                "measured); give round 1's rates or 'auto'"
            )
        return self

    @model_validator(mode="after")
    def _trace_replay(self) -> Pack:
        """A trace's classes are the pack's; a verbatim trace's open-loop rates are its own
        (filled into ``sweep.open_loop_rps``, so the frozen manifest records them)."""
        spec, names, sweep = self.client.trace, self.class_names, self.sweep
        if spec is None or self.client.arrival_pattern != "trace":
            return self
        if spec.format != "capacity-pack" and not spec.classes and len(names) > 1:
            raise ValueError(
                f"client.trace.classes: a {spec.format} trace has no class column; declare "
                f"class rules (name, max_input_tokens) over the pack's classes {names}"
            )
        # The trace module brings pandas: imported only by a pack that replays a trace.
        from capacity_pack.plan.traces import check_classes, verbatim_rates

        trace = spec.arrivals(default_class=names[0])
        check_classes(trace, names, spec.path, spec.format)
        if "hash_ids" in trace.columns and "warm" in sweep.cache_states:
            raise ValueError(
                f"sweep.cache_states: a {spec.format} trace carries its own prefix reuse "
                "(hash_ids), which its prompts replay; measure it cold (warm points prewarm "
                "prompts.prefix's set, which these prompts do not use)"
            )
        if not spec.verbatim:
            return self
        if sweep.search is not None:
            raise ValueError(
                "sweep.search: a verbatim trace is replayed at its own rate (client.trace."
                "time_scales), never at a rate a search bisects; drop the search or use "
                "replay 'stretch'"
            )
        rates = verbatim_rates(trace, spec.time_scales)
        if len(set(rates)) != len(rates) or min(rates) < MIN_OPEN_LOOP_RPS:
            raise ValueError(
                f"client.trace.time_scales {spec.time_scales} give open-loop rates {rates}: "
                f"each must be distinct and at least {MIN_OPEN_LOOP_RPS} RPS"
            )
        if sweep.open_loop_rps and sweep.open_loop_rps != rates:
            raise ValueError(
                f"sweep.open_loop_rps {sweep.open_loop_rps}: a verbatim trace's rates are its "
                f"own, {rates} for time_scales {spec.time_scales}; leave the list empty"
            )
        sweep.open_loop_rps = rates
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> Pack:
        names = [c.name for c in self.workload]
        if len(set(names)) != len(names):
            raise ValueError(f"workload class names must be unique: {names}")
        total = math.fsum(c.mix for c in self.workload)
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"workload mix must sum to 1, got {total}")
        if self.client.class_schedule_counts is not None:
            expected = self.class_counts(self.client.initial_scheduled_requests)
            if self.client.class_schedule_counts != expected:
                raise ValueError(
                    f"client.class_schedule_counts {self.client.class_schedule_counts} differ from "
                    f"the stratified counts {expected} of {self.client.initial_scheduled_requests} "
                    "requests"
                )
        exp_names = [e.name for e in self.experiments]
        if len(set(exp_names)) != len(exp_names):
            raise ValueError(f"experiment names must be unique: {exp_names}")
        if not (self.sweep.has_open_loop or self.sweep.closed_loop_concurrency or self.experiments):
            raise ValueError("nothing to measure: the sweep and experiments are all empty")
        placement = self.engine.placement
        if self.plan.gpus_per_replica * placement.replicas != placement.gpus:
            raise ValueError(
                f"plan.gpus_per_replica ({self.plan.gpus_per_replica}) x engine.placement.replicas"
                f" ({placement.replicas}) must equal engine.placement.gpus ({placement.gpus})"
            )
        if self.plan.replicas_under_test != placement.replicas:
            raise ValueError(
                f"plan.replicas_under_test ({self.plan.replicas_under_test}) must equal "
                f"engine.placement.replicas ({placement.replicas})"
            )
        if isinstance(self.target, SimTarget) and self.target.replicas != placement.replicas:
            raise ValueError(
                f"target.replicas ({self.target.replicas}) must equal engine.placement.replicas "
                f"({placement.replicas})"
            )
        if (
            self.plan.target_utilization is not None
            and self.plan.target_utilization != self.acceptance.target_utilization
        ):
            raise ValueError(
                f"plan.target_utilization ({self.plan.target_utilization}) disagrees with "
                f"acceptance.target_utilization ({self.acceptance.target_utilization})"
            )
        if self.failure is not None:
            n = self.failure.replicas or max(2, placement.replicas)
            for d in self.failure.drills:
                if d.replica >= n:
                    raise ValueError(
                        f"failure drill {d.name!r}: replica {d.replica} does not exist in a "
                        f"{n}-replica drill (0..{n - 1})"
                    )
        sessions = [c.name for c in self.workload if c.session is not None]
        if sessions and self.client.shards > 1:
            raise ValueError(
                f"session classes {sessions} need client.shards: 1 (a session's turns follow "
                "each other in one client process)"
            )
        if "warm" in self.all_cache_states() and self.prompts.prefix is None:
            raise ValueError("warm-cache points need prompts.prefix (the shared-prefix set)")
        if self.prompts.prefix is not None:
            for c in self.workload:
                if (
                    c.session is None  # a session's system prompt comes on top of its input
                    and isinstance(c.input_tokens, int)
                    and c.input_tokens <= self.prompts.prefix.prefix_tokens
                ):
                    raise ValueError(
                        f"class {c.name!r}: input_tokens ({c.input_tokens}) must exceed "
                        f"prompts.prefix.prefix_tokens ({self.prompts.prefix.prefix_tokens})"
                    )
        return self

    @model_validator(mode="after")
    def _point_sizes(self) -> Pack:
        """Every point's schedule within MAX_REQUESTS requests and its measured block within
        MAX_DURATION_S (the formulas of plan.schedule's block sizes, as upper bounds)."""
        c, s = self.client, self.sweep
        sizes: list[tuple[str, float]] = []
        rates = list(s.open_loop_rps)
        if s.search is not None and (first := s.search_initial_rps) is not None:
            # The search measures between its bounds; the schedule grows with the rate.
            rates += sorted({*first, *s.search.rate_bounds(first)} - set(rates))
        elif s.search is not None and s.search.max_rps is not None:
            rates = [s.search.max_rps]
        for r in rates:
            where = "sweep.open_loop_rps" if r in s.open_loop_rps else "sweep.search's rate"
            measured = max(c.initial_scheduled_requests, r * c.minimum_duration_seconds)
            sizes.append((f"{where} {r:g}", measured + r * c.warmup_seconds))
            if c.initial_scheduled_requests / r > MAX_DURATION_S:
                raise ValueError(
                    f"{where} {r:g}: client.initial_scheduled_requests "
                    f"({c.initial_scheduled_requests}) take {c.initial_scheduled_requests / r:.4g}"
                    f" s to arrive, above the bound of {MAX_DURATION_S:,} seconds (30 days)"
                )
        levels = [*s.closed_loop_concurrency, *filter(None, [s.concurrency_bound])]
        for k in levels:
            measured = max(s.closed_loop_min_requests, s.closed_loop_requests_per_worker * k)
            where = (
                "sweep.closed_loop_concurrency"
                if k in s.closed_loop_concurrency
                else ("sweep.search.concurrency's bound")
            )
            sizes.append((f"{where} {k}", measured + k))
        for e in self.experiments:
            sizes.append(
                (f"experiment {e.name!r}", e.expected_requests + e.peak_rps * c.warmup_seconds)
            )
        if (f := self.failure) is not None:
            replicas = f.replicas or max(2, self.engine.placement.replicas)
            if f.rate_rps is not None:
                sizes.append(("failure.rate_rps", f.rate_rps * f.duration_s))
            if f.fallback_rate_per_replica_rps is not None:
                rate = f.fallback_rate_per_replica_rps * replicas
                sizes.append(("failure.fallback_rate_per_replica_rps", rate * f.duration_s))
        # A session class's arrival is up to max_turns requests (capacity_pack.plan.sessions).
        turns = max((w.session.max_turns for w in self.workload if w.session), default=1)
        for where, n in sizes:
            if n * turns > MAX_REQUESTS:
                raise ValueError(
                    f"{where}: the point schedules about {n * turns:.4g} requests"
                    + (f" ({n:.4g} arrivals, sessions of up to {turns} turns)" if turns > 1 else "")
                    + f", above the bound of {MAX_REQUESTS:,} requests per point"
                )
        return self

    # -- derived values ---------------------------------------------------------------------

    @property
    def class_names(self) -> list[str]:
        return [c.name for c in self.workload]

    @property
    def effective_target_utilization(self) -> float:
        return self.plan.target_utilization or self.acceptance.target_utilization

    def all_cache_states(self) -> set[str]:
        states = set(self.sweep.cache_states)
        for e in self.experiments:
            states.update(e.cache_states)
        return states

    def class_counts(self, n: int) -> dict[str, int]:
        return stratified_counts(n, {c.name: c.mix for c in self.workload})

    def weighted_mean_tokens(self) -> tuple[float, float]:
        inp = math.fsum(c.mix * length_stats(c.input_tokens).mean for c in self.workload)
        out = math.fsum(c.mix * length_stats(c.output_tokens).mean for c in self.workload)
        return round(inp, 6), round(out, 6)

    def section(self, name: str) -> Any:
        if name not in SECTIONS:
            raise KeyError(f"unknown manifest section {name!r}; known: {', '.join(SECTIONS)}")
        return self.model_dump(mode="json")[name]

    def sha256(self) -> str:
        return sha256_of_obj(self.model_dump(mode="json"))


def stratified_counts(n: int, mix: dict[str, float]) -> dict[str, int]:
    """Exact class counts summing to ``n`` by the largest-remainder method."""
    # Rounding the quotas first keeps 22,000 x 0.7 = 15399.999... from losing to float error.
    quotas = {k: round(n * v, 9) for k, v in mix.items()}
    counts = {k: math.floor(q) for k, q in quotas.items()}
    left = n - sum(counts.values())
    order = sorted(mix, key=lambda k: (-(quotas[k] - counts[k]), list(mix).index(k)))
    for k in order[:left]:
        counts[k] += 1
    return counts


# ---------------------------------------------------------------------------------------------
# Loading, validation errors, immutability
# ---------------------------------------------------------------------------------------------


def format_validation_error(err: ValidationError, source: str) -> str:
    """File, dotted field path, what was expected, what was given: on one line for one
    problem, else a line per problem under a line naming the file."""
    problems = []
    for e in err.errors():
        parts = [p for p in e["loc"] if not str(p).startswith("function-")]
        # An odd key (a space, a colon, a newline) is quoted, so the line stays one line.
        loc = ".".join(str(p) if re.fullmatch(r"[\w-]+", str(p)) else repr(p) for p in parts)
        loc = loc or "<root>"
        msg = " ".join(e["msg"].removeprefix("Value error, ").split())
        given = e.get("input")
        shown = "" if isinstance(given, dict | list) else f" (got {shorten(given)})"
        problems.append(f"{loc}: {msg}{shown}")
    if len(problems) == 1:
        return f"{source}: invalid pack configuration: {problems[0]}"
    head = f"{source}: invalid pack configuration ({len(problems)} problems):"
    return "\n".join([head, *(f"  - {p}" for p in problems)])


def validate_pack(data: dict[str, Any], source: str = "<config>") -> Pack:
    """Validate a config mapping into a :class:`Pack` or raise :class:`ManifestError`."""
    if not isinstance(data, dict):
        raise ManifestError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        return Pack.model_validate(data)
    except ValidationError as err:
        raise ManifestError(format_validation_error(err, source)) from None


def load_yaml(path: str | Path) -> Any:
    """The data of a YAML (or JSON) file, or :class:`ManifestError` naming the file and the
    first bad byte, line or key (:mod:`capacity_pack.plan.yamlfile`)."""
    path = Path(path)
    try:
        return parse_yaml(decode_utf8(path.read_bytes(), str(path)), str(path))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ManifestError(f"{path}: a directory, not a file") from None
    except TextInputError as err:
        raise ManifestError(str(err)) from None


def load_pack(path: str | Path) -> Pack:
    """Load and validate a pack YAML file (or a frozen manifest JSON)."""
    path = Path(path)
    return validate_pack(unwrap_frozen(load_yaml(path)), str(path))


def unwrap_frozen(data: Any) -> Any:
    """The pack inside a frozen manifest document, or inside a pack folder's
    ``workload-manifest.yaml`` (the pack under its ``frozen_sha256``); any other data as it is."""
    if isinstance(data, dict) and data.get("format") == FROZEN_FORMAT:
        return data.get("manifest")
    if isinstance(data, dict) and "frozen_sha256" in data:
        return {k: v for k, v in data.items() if k != "frozen_sha256"}
    return data


def mutable_revision_fields(pack: Pack) -> list[tuple[str, str]]:
    """Every revision-like field that names a moving target: (dotted field, value)."""
    fields = {
        "model.revision": pack.model.revision,
        "model.tokenizer_revision": pack.model.tokenizer_revision,
        "model.precision": pack.model.precision,
        "engine.version": pack.engine.version,
        "engine.scheduler": pack.engine.scheduler,
        "request.chat_template": pack.request.chat_template,
        "prompts.corpus_revision": pack.prompts.corpus_revision,
    }
    if pack.prompts.prefix is not None:
        fields["prompts.prefix.revision"] = pack.prompts.prefix.revision
    return [(k, v) for k, v in fields.items() if is_mutable_revision(v)]


# ---------------------------------------------------------------------------------------------
# Freeze
# ---------------------------------------------------------------------------------------------


def freeze(pack: Pack, source: str = "<config>") -> dict[str, Any]:
    """The canonical frozen manifest of ``pack`` (a JSON-ready dict).

    Raises :class:`ManifestError` naming every field that holds a mutable revision.
    """
    bad = mutable_revision_fields(pack)
    if bad:
        listed = "; ".join(f"{k} = {v!r}" for k, v in bad)
        raise ManifestError(
            f"{source}: refusing to freeze mutable revisions ({listed}); pin each to an "
            "immutable revision (a commit hash, a released version or a dated tag)"
        )
    manifest = pack.model_dump(mode="json")
    inp, out = pack.weighted_mean_tokens()
    n = pack.client.initial_scheduled_requests
    derived = {
        "pack_label": pack.pack.label,
        "weighted_mean_input_tokens": inp,
        "weighted_mean_output_tokens": out,
        "class_schedule_counts": pack.class_counts(n),
        "length_stats": {
            c.name: {
                "input_tokens": length_stats(c.input_tokens).model_dump(),
                "output_tokens": length_stats(c.output_tokens).model_dump(),
            }
            for c in pack.workload
        },
        "fixed_length_classes": [
            c.name
            for c in pack.workload
            if isinstance(c.input_tokens, int) and isinstance(c.output_tokens, int)
        ],
    }
    if (spec := pack.client.trace) is not None and pack.client.arrival_pattern == "trace":
        # What the trace sends, per class: its own lengths, not the classes' declared ones.
        from capacity_pack.plan.traces import trace_summary

        trace = spec.arrivals(default_class=pack.class_names[0])
        derived["trace"] = trace_summary(trace, pack.class_names)
    return {
        "format": FROZEN_FORMAT,
        "sha256": sha256_of_obj(manifest),
        "section_sha256": {name: sha256_of_obj(manifest[name]) for name in SECTIONS},
        "manifest": manifest,
        "derived": derived,
        "tool": {"capacity_pack_version": __version__},
    }


def load_frozen(path: str | Path) -> tuple[Pack, dict[str, Any]]:
    """Read a frozen manifest, verify its hash, and return the pack and the document."""
    import json

    path = Path(path)
    try:
        doc = json.loads(decode_utf8(path.read_bytes(), str(path)))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except TextInputError as err:
        raise ManifestError(str(err)) from None
    except json.JSONDecodeError as err:
        raise ManifestError(f"{path}: not valid JSON: {err}") from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FROZEN_FORMAT
        or not isinstance(doc.get("manifest"), dict)
    ):
        raise ManifestError(f"{path}: not a frozen manifest (format {FROZEN_FORMAT!r} expected)")
    try:
        digest = sha256_of_obj(doc["manifest"])
    except ValueError:  # NaN or infinity, which JSON has no words for
        digest = None
    if digest is None or digest != doc.get("sha256"):
        raise ManifestError(f"{path}: manifest content does not match its sha256 (edited?)")
    return validate_pack(doc["manifest"], str(path)), doc


def json_schema(cache_resets: Sequence[str] | None = None) -> dict[str, Any]:
    """JSON schema of the pack configuration, for editors; ``cache_resets``: the allowed
    ``target.cache_reset`` values (the engines' registry knows them), as its enum."""
    schema = Pack.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "capacity-pack configuration"
    if cache_resets is not None:
        prop = schema["$defs"]["OpenAITarget"]["properties"]["cache_reset"]
        prop.pop("pattern", None)
        prop["enum"] = list(cache_resets)
    return schema
