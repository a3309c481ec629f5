"""Two capacity packs side by side: what differs, and whether it exceeds run-to-run variation.

``capacity-pack compare A B`` reads two finished packs (a results folder ``results/<pack>``, its
``pack/`` subfolder, or an MLflow parent run ``mlflow:<run id>`` whose ``pack/`` artifacts are
downloaded) and reports B against A: the capacity per cache state, every class's SLO
attainment and P95 latencies at the offered rates both packs measured, the closed-loop curve,
the replica plan, the failure drills and the manifest fields that differ. Each difference is
judged against the run-to-run variation the packs themselves measured, and only the tests
below may call a difference "beyond run-to-run variation"; everything else is shown side by
side and flagged when it differs.

**Capacity (per cache state): non-overlap of the evidence brackets.** A pack's search bracket
[pass_rps, fail_rps) names the lowest tested rate above the capacity whatever its status, but
a rate that is ``inconclusive``, ``marginal`` or ``inconsistent`` has not been shown to fail:
two runs of one pack differ there by chance (on the default pack, one run passed 30 RPS twice
while another left it inconclusive, so their search brackets [30, 32) and [25, 30) do not
overlap). The comparison therefore uses each pack's **evidence bracket** [L, U): L = the
capacity (the highest rate passing in every repeat with every lower rate passing; 0 when none
passes), U = the lowest tested rate above L whose status is ``fail`` (+inf when none fails).
A pass is a confidence-sequence lower bound above the gate in every repeat; a fail is a
gate failed in every deciding repeat (for attainment, mostly with its upper bound under the
gate). B differs from A beyond run-to-run variation when the brackets are disjoint,
U_B <= L_A (B fails a rate A passes) or U_A <= L_B. The headline change is L_B / L_A - 1.

**Attainment at matched rates: Newcombe's hybrid score interval.** For a class at an offered
rate both packs measured (same cache state), p = k / n with k the requests meeting the SLO and
n the successful requests, pooled over the rate's deciding repeats (``capacity.json``). The
outcomes of requests sharing a queue are serially correlated, so each side is taken at its
effective sample k / deff of n / deff, deff the largest batch-means design effect of the
class over the rate's repeats (``attainment_design_effect`` of the per-point reports; 1 when
the source has no per-point reports, which the report says). With Wilson score intervals
(l_A, u_A), (l_B, u_B) at confidence c' (below), d = p_B - p_A lies in

    [d - sqrt((p_B - l_B)^2 + (u_A - p_A)^2),  d + sqrt((u_B - p_B)^2 + (p_A - l_A)^2)]

(Newcombe, Statist. Med. 17, 1998, method 10); it keeps its coverage near 0 and 1 where the
Wald interval of a difference fails. Beyond run-to-run variation when it excludes 0. A rate
with a client-bound deciding repeat is tested all the same and marked so in its status.

**P95 latencies at matched rates: pooled between-repeat variation on the log scale.** The
per-point reports hold each repeat's P95 but no interval for it, and a pack's ``pack/`` folder
holds no raw requests to bootstrap from, so the variation of a P95 is the one the repeats
show: latencies are multiplicative (a slower engine scales them), so the log scale. For each
metric (P95 TTFT, TPOT, E2E), every (pack, cache state, rate, class) with n >= 2 repeats gives
a variance v of log P95: the sample variance of the repeats' logs when the per-point reports
are there, else (ln(max / min) / d2(n))^2 from the range ``capacity.json`` keeps, d2(n) the
expected range of n standard normal values (Tippett 1925; 1.128 at n = 2, where the range is
the two repeats exactly). Pooled over both packs, s^2 = sum (n_i - 1) v_i / sum (n_i - 1),
with df = sum (n_i - 1) degrees of freedom. At a matched rate, with m_A, m_B the mean log P95
(the log of the mean without reports),

    t = (m_B - m_A) / (s sqrt(1/n_A + 1/n_B)),   beyond when |t| > t_{df}(1/2 + c'/2),

and the ratio B / A = exp(m_B - m_A) with its interval exp(m_B - m_A +- t_{df} s
sqrt(1/n_A + 1/n_B)). This assumes one log-scale variance per metric across rates and
classes; the repeated points of a searching pack sit at its boundary, where latencies vary
most, so s errs towards the wide side at lower rates. Only rates that neither pack fails are
tested: past capacity the queue grows and a percentile measures the run's length, not the
engine. Without any repeated point (df = 0) nothing is called beyond variation.

**Simultaneous confidence.** The attainment and latency comparisons are one family of m
tests at a family-wise confidence c (``--confidence``, default 0.95): each interval is taken
at c' = 1 - (1 - c) / m (Bonferroni), so two runs of one pack show any attainment or latency
difference with probability at most 1 - c under the assumptions above.

**Not tested.** The plan (replicas, GPUs, cost) follows from the capacity: a plan that differs
while the capacity it sizes from is within variation is within variation too, and the report
says so. The failure drills run once per pack, so there is no run-to-run variation to judge
them against: a differing verdict (the plan drill's N+1, an expected alert, a recovery) is
flagged, not tested. The closed-loop curve is shown side by side.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capacity_pack.binomial import wilson_interval
from capacity_pack.errors import StatedError
from capacity_pack.io import sha256_of_obj, write_json_atomic, write_text_atomic

#: The prefix of an MLflow parent run as a compare source.
MLFLOW_PREFIX = "mlflow:"
LATENCY_METRICS = {"p95_ttft_ms": "P95 TTFT", "p95_tpot_ms": "P95 TPOT", "p95_e2e_ms": "P95 E2E"}
BEYOND = "beyond run-to-run variation"
WITHIN = "within run-to-run variation"
NO_DIFFERENCE = "no difference beyond run-to-run variation"
#: The most differing fields listed per manifest section.
MAX_FIELDS_PER_SECTION = 25


class CompareError(StatedError):
    """A compare source that is not a readable pack: the message names it and what was expected."""


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


@dataclass
class Source:
    """One side of the comparison, read from a results folder or an MLflow parent run."""

    label: str
    origin: str
    pack_dir: Path
    capacity: dict[str, Any]
    plan: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    manifest_sha256: str | None = None
    manifest_from: str | None = None
    #: Per-point SLO reports, keyed (cache state, offered rps, repeat); open loop only.
    reports: dict[tuple[str, float, int], dict[str, Any]] = field(default_factory=dict)
    reports_from: str | None = None

    @property
    def name(self) -> str:
        return str(self.capacity.get("pack") or "?")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CompareError(f"{path}: no such file; expected the pack's {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CompareError(f"{path}: not readable as JSON ({err}); expected {what}") from None
    if not isinstance(doc, dict):
        raise CompareError(f"{path}: a JSON {type(doc).__name__}, expected an object ({what})")
    return doc


def _optional_json(path: Path, what: str) -> dict[str, Any] | None:
    return _read_json(path, what) if path.is_file() else None


def _pack_folders(path: Path) -> list[Path]:
    """The pack folders ``path`` names: itself, its ``pack/``, or one level or two down (a
    ``results/`` folder, a work directory)."""
    if (path / "capacity.json").is_file():
        return [path]
    for pattern in ("pack", "*/pack", "results/*/pack"):
        found = sorted(p for p in path.glob(pattern) if (p / "capacity.json").is_file())
        if found:
            return found
    return []


def load_folder(text: str, label: str) -> Source:
    """A pack from a results folder (``results/<pack>``, its ``pack/``, a ``results/`` holding
    one pack, or the work directory above it)."""
    path = Path(text).expanduser()
    if not path.exists():
        raise CompareError(
            f"{text}: no such folder; expected a results folder (results/<pack>), its pack/ "
            f"subfolder or {MLFLOW_PREFIX}<parent run id>"
        )
    if not path.is_dir():
        raise CompareError(f"{text}: a file, not a folder; expected a results folder or its pack/")
    found = _pack_folders(path)
    if not found:
        raise CompareError(
            f"{text}: not a capacity pack: no capacity.json in it, in its pack/ subfolder or in "
            "results/<pack>/pack/ below it (has the pipeline reached its capacity stage?)"
        )
    if len(found) > 1:
        names = ", ".join(str(p.parent.name) for p in found)
        raise CompareError(f"{text}: holds {len(found)} packs ({names}); name one of them")
    pack_dir = found[0]
    src = _read_pack_dir(pack_dir, label, origin=str(path))
    results = pack_dir.parent
    frozen = results / "manifest" / "frozen.json"
    if frozen.is_file():
        doc = _read_json(frozen, "frozen manifest")
        src.manifest, src.manifest_sha256 = doc.get("manifest"), doc.get("sha256")
        src.manifest_from = str(frozen)
    reports = sorted(results.glob("reports/*/*/rep*/slo-report.json"))
    if reports:
        src.reports = _index_reports(_read_json(p, "per-point SLO report") for p in reports)
        src.reports_from = str(results / "reports")
    return src


def _read_pack_dir(pack_dir: Path, label: str, origin: str) -> Source:
    capacity = _read_json(pack_dir / "capacity.json", "capacity.json (the capacity stage's)")
    if not isinstance(capacity.get("open_loop"), dict):
        raise CompareError(
            f"{pack_dir / 'capacity.json'}: field open_loop missing or not an object; expected "
            "a capacity.json written by the capacity stage"
        )
    src = Source(
        label=label,
        origin=origin,
        pack_dir=pack_dir,
        capacity=capacity,
        plan=_optional_json(pack_dir / "plan.json", "plan.json"),
        failure=_optional_json(pack_dir / "failure-test.json", "failure-test.json"),
    )
    manifest = pack_dir / "workload-manifest.yaml"
    if manifest.is_file():
        from capacity_pack.plan.manifest import load_yaml

        data = load_yaml(manifest)
        if isinstance(data, dict):
            src.manifest_sha256 = data.get("frozen_sha256")
            src.manifest = {k: v for k, v in data.items() if k != "frozen_sha256"}
            src.manifest_from = str(manifest)
    return src


def _index_reports(docs) -> dict[tuple[str, float, int], dict[str, Any]]:
    out = {}
    for r in docs:
        if r.get("mode") == "open" and r.get("offered_rps") is not None:
            out[(str(r["cache_state"]), float(r["offered_rps"]), int(r["repeat"]))] = r
    return out


def tracking_uri(option: str | None) -> str:
    """``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else ``results/mlflow.db`` here."""
    uri = (option or os.environ.get("MLFLOW_TRACKING_URI", "")).strip()
    if uri:
        return uri
    local = Path("results") / "mlflow.db"
    if local.is_file():
        return "sqlite:///" + str(local.resolve())
    raise CompareError(
        "no MLflow tracking store: pass --tracking-uri or set MLFLOW_TRACKING_URI (no "
        "results/mlflow.db in this folder)"
    )


def load_mlflow(text: str, label: str, tracking: str | None, scratch: Path) -> Source:
    """A pack from an MLflow parent run: its ``pack/`` artifacts, its frozen manifest and the
    per-point reports of its ``analyze`` child runs, downloaded under ``scratch``."""
    run_id = text[len(MLFLOW_PREFIX) :].strip()
    if not run_id:
        raise CompareError(f"{text}: no run id; expected {MLFLOW_PREFIX}<parent run id>")
    uri = tracking_uri(tracking)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        # Opening a client on a missing SQLite file would create an empty store.
        raise CompareError(f"{uri}: no such MLflow store (the SQLite file does not exist)")
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise CompareError(f"{text}: no such run in the MLflow store {uri}") from None
    tags = run.data.tags
    if tags.get("capacity_pack.run_kind") != "parent":
        parent = tags.get("mlflow.parentRunId")
        hint = f"; its parent is {MLFLOW_PREFIX}{parent}" if parent else ""
        raise CompareError(
            f"{text}: not a capacity-pack parent run (tag capacity_pack.run_kind is "
            f"{tags.get('capacity_pack.run_kind')!r}, expected 'parent'){hint}"
        )
    where = scratch / label
    where.mkdir(parents=True)
    try:
        pack_dir = Path(client.download_artifacts(run_id, "pack", str(where)))
    except (MlflowException, OSError):
        pack_dir = where / "pack"
    if not (pack_dir / "capacity.json").is_file():
        raise CompareError(
            f"{text}: the parent run has no pack/capacity.json artifact; expected a pack the "
            "pipeline finished (its report stage logs pack/)"
        )
    src = _read_pack_dir(pack_dir, label, origin=text)
    if src.manifest is None:
        with contextlib.suppress(MlflowException, OSError):
            frozen = Path(client.download_artifacts(run_id, "frozen_manifest.json", str(where)))
            doc = _read_json(frozen, "frozen manifest")
            src.manifest, src.manifest_sha256 = doc.get("manifest"), doc.get("sha256")
            src.manifest_from = f"{text} frozen_manifest.json"
    src.manifest_sha256 = src.manifest_sha256 or tags.get("capacity_pack.manifest_sha256")
    src.reports = _mlflow_reports(client, run, where / "reports")
    if src.reports:
        src.reports_from = f"{text} child runs"
    return src


#: Where a child run keeps its point's SLO report: the analyze job's own run, or the point's
#: run with a folder per job.
REPORT_ARTIFACTS = ("slo-report.json", "analysis/slo-report.json")


def _mlflow_reports(client, run, where: Path) -> dict[tuple[str, float, int], dict[str, Any]]:
    """The newest ``slo-report.json`` of each open-loop point among the parent's child runs."""
    from mlflow.exceptions import MlflowException

    try:
        children = client.search_runs(
            [run.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}'",
            order_by=["attributes.start_time ASC"],
        )
    except MlflowException:
        return {}
    docs = []
    for child in children:  # oldest first: a newer report of the same point replaces it
        point = child.data.tags.get("capacity_pack.point")
        if point is not None and not point.startswith("open-"):
            continue
        with contextlib.suppress(MlflowException, OSError, CompareError):
            path = _report_artifact(client, child.info.run_id)
            if path is not None:
                local = client.download_artifacts(
                    child.info.run_id, path, str(where / child.info.run_id)
                )
                docs.append(_read_json(Path(local), "per-point SLO report"))
    return _index_reports(docs)


def _report_artifact(client, run_id: str) -> str | None:
    """Which of :data:`REPORT_ARTIFACTS` the run holds (listed, not downloaded: most child runs
    are other jobs' and hold none)."""
    for path in REPORT_ARTIFACTS:
        folder = path.rpartition("/")[0] or None
        if any(f.path == path for f in client.list_artifacts(run_id, folder)):
            return path
    return None


@contextlib.contextmanager
def _quiet_downloads() -> Iterator[None]:
    """MLflow draws a progress bar per download on stderr: dozens of them here."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def open_sources(a: str, b: str, tracking: str | None = None) -> Iterator[tuple[Source, Source]]:
    """Both sources, read; MLflow downloads live in a temporary folder until the block ends."""
    with tempfile.TemporaryDirectory(prefix="capacity-pack-compare-") as tmp:
        out = []
        for text, label in ((a, "A"), (b, "B")):
            if text.startswith(MLFLOW_PREFIX):
                with _quiet_downloads():
                    out.append(load_mlflow(text, label, tracking, Path(tmp)))
            else:
                out.append(load_folder(text, label))
        yield out[0], out[1]


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def newcombe_interval(
    k_a: float, n_a: float, k_b: float, n_b: float, confidence: float
) -> tuple[float, float] | None:
    """Newcombe's hybrid score interval for p_B - p_A (module docstring); None without trials
    on either side. Counts may be fractional (effective samples)."""
    wa, wb = wilson_interval(k_a, n_a, confidence), wilson_interval(k_b, n_b, confidence)
    if wa is None or wb is None:
        return None
    pa, pb = k_a / n_a, k_b / n_b
    d = pb - pa
    low = d - math.sqrt((pb - wb[0]) ** 2 + (wa[1] - pa) ** 2)
    high = d + math.sqrt((wb[1] - pb) ** 2 + (pa - wa[0]) ** 2)
    return max(-1.0, low), min(1.0, high)


def excludes_zero(interval: tuple[float, float] | None) -> bool:
    return interval is not None and (interval[0] > 0 or interval[1] < 0)


_D2: dict[int, float] = {}


def d2(n: int) -> float:
    """The expected range of n independent standard normal values (Tippett's d2):
    integral of 1 - Phi(x)^n - (1 - Phi(x))^n over the real line."""
    if n < 2:
        raise ValueError(f"d2 needs n >= 2, got {n}")
    if n not in _D2:
        from scipy.integrate import quad
        from scipy.stats import norm

        value, _ = quad(lambda x: 1 - norm.cdf(x) ** n - norm.sf(x) ** n, -12, 12, limit=200)
        _D2[n] = float(value)
    return _D2[n]


@dataclass(frozen=True)
class LogSample:
    """One pack's P95 at one rate and class: its repeats on the log scale."""

    n: int
    mean_log: float
    #: Variance of the log values (None below two repeats).
    var_log: float | None
    mean: float
    low: float
    high: float
    basis: str  # "repeats" (per-point reports) or "range" (capacity.json min / max / mean)


def log_sample(values: list[float] | None, summary: dict[str, Any] | None) -> LogSample | None:
    """From the repeats' values when given, else from capacity.json's n / mean / min / max."""
    import numpy as np

    vals = [float(v) for v in values or [] if v is not None and float(v) > 0]
    if vals:
        x = np.log(np.asarray(vals))
        var = float(x.var(ddof=1)) if x.size >= 2 else None
        return LogSample(len(vals), float(x.mean()), var, float(np.mean(vals)), min(vals),
                         max(vals), "repeats")  # fmt: skip
    s = summary or {}
    n, mean, lo, hi = s.get("n") or 0, s.get("mean"), s.get("min"), s.get("max")
    if not n or mean is None or lo is None or hi is None or min(mean, lo, hi) <= 0:
        return None
    var = (math.log(hi / lo) / d2(n)) ** 2 if n >= 2 else None
    return LogSample(int(n), math.log(mean), var, float(mean), float(lo), float(hi), "range")


def pooled_log_variance(samples: list[LogSample]) -> tuple[float | None, int]:
    """s^2 = sum (n_i - 1) v_i / sum (n_i - 1) over the samples with a variance, and its df."""
    df = sum(s.n - 1 for s in samples if s.var_log is not None)
    if df == 0:
        return None, 0
    return sum((s.n - 1) * s.var_log for s in samples if s.var_log is not None) / df, df


def _log_difference(a: LogSample, b: LogSample) -> float:
    """m_B - m_A: mean log P95s when both sides have their repeats, else the logs of the means
    (one kind on both sides: the mean of logs sits below the log of the mean)."""
    if a.basis == b.basis == "repeats":
        return b.mean_log - a.mean_log
    return math.log(b.mean) - math.log(a.mean)


def log_ratio_test(
    a: LogSample, b: LogSample, var: float | None, df: int, confidence: float
) -> dict[str, Any]:
    """B / A of a P95 and whether it exceeds the pooled variation (module docstring)."""
    d = _log_difference(a, b)
    ratio = math.exp(d)
    if var is None or df == 0:
        return {"ratio": ratio, "interval": None, "t": None, "beyond": False,
                "why": "no repeated point: no estimate of run-to-run variation"}  # fmt: skip
    from scipy.stats import t as student

    se = math.sqrt(var * (1 / a.n + 1 / b.n))
    q = float(student.ppf(0.5 + confidence / 2, df))
    stat = d / se if se > 0 else (math.inf if d else 0.0)
    return {
        "ratio": ratio,
        "interval": [math.exp(d - q * se), math.exp(d + q * se)],
        "t": stat,
        "beyond": abs(stat) > q,
        "why": None,
    }


# ---------------------------------------------------------------------------------------------
# Capacity
# ---------------------------------------------------------------------------------------------


def evidence_bracket(sel: dict[str, Any] | None) -> dict[str, Any] | None:
    """[L, U): the capacity (0 when nothing passes) and the lowest rate above it that fails."""
    if not sel:
        return None
    low = sel.get("capacity_rps")
    fails = [
        float(r["offered_rps"]) for r in sel.get("rates", [])
        if r.get("status") == "fail" and (low is None or float(r["offered_rps"]) > low)
    ]  # fmt: skip
    return {"low": float(low) if low is not None else 0.0, "high": min(fails, default=math.inf),
            "capacity_rps": low}  # fmt: skip


def brackets_disjoint(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return False
    return b["high"] <= a["low"] or a["high"] <= b["low"]


def compare_capacity(a: Source, b: Source) -> list[dict[str, Any]]:
    states = sorted(set(a.capacity["open_loop"]) | set(b.capacity["open_loop"]))
    rows = []
    for state in states:
        sa, sb = a.capacity["open_loop"].get(state), b.capacity["open_loop"].get(state)
        ea, eb = evidence_bracket(sa), evidence_bracket(sb)
        ca = sa.get("capacity_rps") if sa else None
        cb = sb.get("capacity_rps") if sb else None
        change = (cb - ca) / ca if ca and cb is not None else None
        search = [s.get("bracket") if s else None for s in (sa, sb)]
        search_disjoint = all(search) and _search_disjoint(*search)
        beyond = brackets_disjoint(ea, eb)
        rows.append(
            {
                "cache_state": state,
                "capacity_rps": [ca, cb],
                "change": change,
                "search_bracket": search,
                "evidence_bracket": [ea, eb],
                "per_replica_rps": [
                    s.get("capacity_per_replica_rps") if s else None for s in (sa, sb)
                ],  # fmt: skip
                "goodput_per_gpu_rps": [
                    s.get("goodput_per_gpu_rps") if s else None for s in (sa, sb)
                ],  # fmt: skip
                "decision": [s.get("decision") if s else None for s in (sa, sb)],
                "beyond": beyond,
                "in_both": sa is not None and sb is not None,
                "note": _capacity_note(beyond, bool(search_disjoint), sa, sb, ea, eb),
            }
        )
    return rows


def _search_disjoint(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def ends(x):
        lo = x.get("pass_rps") if x.get("pass_rps") is not None else 0.0
        hi = x.get("fail_rps") if x.get("fail_rps") is not None else math.inf
        return lo, hi

    (la, ha), (lb, hb) = ends(a), ends(b)
    return hb <= la or ha <= lb


def _capacity_note(beyond, search_disjoint, sa, sb, ea, eb) -> str:
    if sa is None or sb is None:
        return f"measured only in {'A' if sb is None else 'B'}: not compared"
    if beyond:
        worse, better = (eb, ea) if eb["high"] <= ea["low"] else (ea, eb)
        name = "B" if worse is eb else "A"
        return (f"{name} fails {_rps(worse['high'])} RPS, at or below a rate the other passes "
                f"({_rps(better['low'])} RPS)")  # fmt: skip
    if search_disjoint:
        return ("the search brackets do not overlap, but the rates between them are undecided "
                "(inconclusive, marginal or inconsistent) in at least one pack")  # fmt: skip
    return "the evidence brackets overlap"


# ---------------------------------------------------------------------------------------------
# Matched rates: attainment and latency
# ---------------------------------------------------------------------------------------------


def _rows_by_rate(sel: dict[str, Any] | None) -> dict[float, dict[str, Any]]:
    return {float(r["offered_rps"]): r for r in (sel or {}).get("rates", [])}


def _deciding_repeats(row: dict[str, Any]) -> list[int]:
    return [int(p["repeat"]) for p in row.get("per_repeat", [])]


def _class_reports(src: Source, state: str, rate: float, row: dict[str, Any], cls: str):
    out = []
    for k in _deciding_repeats(row):
        rep = src.reports.get((state, rate, k))
        if rep is not None and cls in rep.get("classes", {}):
            out.append(rep["classes"][cls])
    return out


def matched_rates(a: Source, b: Source) -> list[tuple[str, float, dict, dict]]:
    out = []
    for state in sorted(set(a.capacity["open_loop"]) & set(b.capacity["open_loop"])):
        ra = _rows_by_rate(a.capacity["open_loop"][state])
        rb = _rows_by_rate(b.capacity["open_loop"][state])
        out.extend((state, rate, ra[rate], rb[rate]) for rate in sorted(set(ra) & set(rb)))
    return out


def _status(row: dict[str, Any]) -> str | None:
    """The rate's status, marked when a deciding repeat was client-bound: its requests are the
    server's answers, but the load was not sent as scheduled, so the reader should know."""
    status = row.get("status")
    if any(str(r).startswith("client-bound") for r in row.get("reasons", [])):
        return f"{status}, client-bound"
    return status


def _classes(row: dict[str, Any]) -> dict[str, Any]:
    return ((row.get("variation") or {}).get("classes")) or {}


def attainment_rows(a: Source, b: Source) -> list[dict[str, Any]]:
    """Per matched (state, rate, class): counts, effective counts; the test comes later."""
    rows = []
    for state, rate, ra, rb in matched_rates(a, b):
        ca, cb = _classes(ra), _classes(rb)
        for cls in [c for c in ca if c in cb]:
            sides = []
            for src, row, cv in ((a, ra, ca), (b, rb, cb)):
                pooled = (cv[cls].get("attainment") or {}).get("pooled") or {}
                reps = _class_reports(src, state, rate, row, cls)
                deffs = [r.get("attainment_design_effect") for r in reps]
                deffs = [float(d) for d in deffs if d is not None]
                sides.append(
                    {
                        "passing": pooled.get("count"),
                        "successful": pooled.get("trials"),
                        "attainment": pooled.get("value"),
                        "design_effect": max(deffs, default=1.0),
                        "design_effect_known": bool(deffs),
                        "status": _status(row),
                        "repeats": row.get("repeats"),
                    }
                )
            rows.append({"cache_state": state, "offered_rps": rate, "class": cls, "sides": sides})
    return rows


def _test_attainment(row: dict[str, Any], confidence: float) -> None:
    a, b = row["sides"]
    if not a["successful"] or not b["successful"]:
        row.update(difference=None, interval=None, beyond=False, tested=False,
                   why="no successful requests on one side")  # fmt: skip
        return
    # One design effect for both sides, the larger: under the null hypothesis both runs are the
    # same process, and a run without misses cannot estimate its own (its batch means do not
    # vary, so its estimate is 1 however bursty the misses would be).
    deff = max(a["design_effect"], b["design_effect"])
    row["design_effect"] = deff
    ka, na = a["passing"] / deff, a["successful"] / deff
    kb, nb = b["passing"] / deff, b["successful"] / deff
    ci = newcombe_interval(ka, na, kb, nb, confidence)
    row.update(
        difference=b["passing"] / b["successful"] - a["passing"] / a["successful"],
        interval=list(ci) if ci else None,
        beyond=excludes_zero(ci),
        tested=True,
        why=None,
    )


def _p95_sample(src: Source, state: str, rate: float, row: dict[str, Any], cls: str, metric: str):
    reps = _class_reports(src, state, rate, row, cls)
    # Per-repeat values only when every deciding repeat's report is there.
    values = [r.get(metric) for r in reps] if len(reps) == len(_deciding_repeats(row)) else None
    return log_sample(values, _classes(row)[cls].get(metric))


def latency_variation(sources: tuple[Source, ...]) -> dict[str, Any]:
    """Per metric: the between-repeat variance of log P95 pooled over every repeated point of
    every source at a rate it does not fail (matched with the other pack or not: the variation
    of a point's repeats needs no partner)."""
    out = {}
    for m in LATENCY_METRICS:
        samples = [
            _p95_sample(src, state, float(row["offered_rps"]), row, cls, m)
            for src in sources
            for state, sel in src.capacity["open_loop"].items()
            for row in sel.get("rates", [])
            if row.get("status") != "fail" and len(_deciding_repeats(row)) >= 2
            for cls in _classes(row)
        ]  # fmt: skip
        samples = [x for x in samples if x is not None]
        var, df = pooled_log_variance(samples)
        out[m] = {"var_log": var, "sd_log": math.sqrt(var) if var is not None else None,
                  "df": df, "points": sum(x.var_log is not None for x in samples)}  # fmt: skip
    return out


def latency_rows(a: Source, b: Source) -> list[dict[str, Any]]:
    """Per matched (state, rate, class): each metric's log samples of A and B."""
    rows = []
    for state, rate, ra, rb in matched_rates(a, b):
        ca, cb = _classes(ra), _classes(rb)
        for cls in [c for c in ca if c in cb]:
            metrics = {
                m: {"samples": [_p95_sample(a, state, rate, ra, cls, m),
                                _p95_sample(b, state, rate, rb, cls, m)]}
                for m in LATENCY_METRICS
            }  # fmt: skip
            rows.append({"cache_state": state, "offered_rps": rate, "class": cls,
                         "eligible": "fail" not in (ra.get("status"), rb.get("status")),
                         "statuses": [_status(ra), _status(rb)],
                         "metrics": metrics})  # fmt: skip
    return rows


def _test_latency(row: dict[str, Any], pooled: dict[str, Any], confidence: float) -> None:
    for m, entry in row["metrics"].items():
        sa, sb = entry["samples"]
        if not row["eligible"]:
            entry.update(tested=False, beyond=False, ratio=_ratio(sa, sb), interval=None,
                         why="a pack fails this rate: past capacity a percentile measures the "
                         "run's length")  # fmt: skip
        elif sa is None or sb is None:
            entry.update(tested=False, beyond=False, ratio=None, interval=None, why="no value")
        else:
            p = pooled[m]
            entry.update(tested=True, **log_ratio_test(sa, sb, p["var_log"], p["df"], confidence))


def _ratio(a: LogSample | None, b: LogSample | None) -> float | None:
    return math.exp(_log_difference(a, b)) if a is not None and b is not None else None


# ---------------------------------------------------------------------------------------------
# Plan, drills, closed loop, manifests
# ---------------------------------------------------------------------------------------------


PLAN_FIELDS = (
    ("required_replicas", "replicas", ("required_replicas",)),
    ("required_gpus", "GPUs", ("required_gpus",)),
    ("bound_by", "bound by", ("bound_by",)),
    ("capacity_cache_state", "sized on cache state", ("capacity_cache_state",)),
    ("capacity_per_replica_rps", "capacity per replica (RPS)",
     ("throughput", "capacity_per_replica_rps")),
    ("peak_rps", "peak (RPS)", ("throughput", "peak_rps")),
    ("planned_utilization", "planned utilization", ("throughput", "planned_utilization")),
    ("cost_per_hour", "cost per hour", ("cost", "cost_per_hour")),
    ("cost_per_request", "cost per request", ("cost", "cost_per_request")),
    ("reason", "no plan because", ("reason",)),
)  # fmt: skip


def _dig(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def compare_plan(a: Source, b: Source, capacity: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for key, label, path in PLAN_FIELDS:
        va, vb = _dig(a.plan, path), _dig(b.plan, path)
        if va is None and vb is None:
            continue
        rows.append({"field": key, "label": label, "values": [va, vb], "differs": va != vb})
    differs = any(r["differs"] for r in rows if r["field"] in ("required_replicas",
                                                                "required_gpus"))  # fmt: skip
    state = _dig(a.plan, ("capacity_cache_state",)) or _dig(b.plan, ("capacity_cache_state",))
    cap = next((c for c in capacity if c["cache_state"] == state), None)
    if a.plan is None or b.plan is None:
        note = f"no plan.json in {'A' if a.plan is None else 'B'}"
    elif not differs:
        note = "the same fleet"
    elif cap is not None and not cap["beyond"]:
        note = (f"the fleets differ, but the {state} capacity they are sized from is within "
                "run-to-run variation, so this difference is too")  # fmt: skip
    else:
        note = f"the fleets differ, following a {state} capacity that differs beyond variation"
    return {"rows": rows, "differs": differs, "note": note}


def _drill_facts(r: dict[str, Any]) -> dict[str, Any]:
    if r.get("skipped"):
        return {"outcome": f"skipped: {r['skipped']}"}
    inj, det, rec = r.get("injection_time_s"), r.get("detection_time_s"), r.get("recovery_time_s")
    n = r.get("n_plus_one") or {}
    return {
        "outcome": n.get("verdict")
        or ("alert fired" if r.get("expected_alert_fired") else "expected alert NOT fired"),
        "recovered": rec is not None,
        "detected_after_s": det - inj if det is not None and inj is not None else None,
        "recovered_after_s": rec - inj if rec is not None and inj is not None else None,
        "rejected": r.get("requests_rejected"),
        "lost": r.get("requests_lost"),
    }


def compare_drills(a: Source, b: Source) -> dict[str, Any]:
    if a.failure is None or b.failure is None:
        missing = " and ".join(s.label for s in (a, b) if s.failure is None)
        return {"rows": [], "plan_drill": None, "differs": False,
                "note": f"no failure-test.json in {missing}: drills not compared"}  # fmt: skip
    plans = [s.failure.get("plan_drill") for s in (a, b)]
    by_name = [{r["drill"]: r for r in s.failure.get("drills", [])} for s in (a, b)]
    names = list(dict.fromkeys([*by_name[0], *by_name[1]]))
    rows = []
    for name in names:
        facts = [_drill_facts(d[name]) if name in d else None for d in by_name]
        verdict = [(f or {}).get("outcome") for f in facts], [(f or {}).get("recovered")
                                                              for f in facts]  # fmt: skip
        differs = verdict[0][0] != verdict[0][1] or verdict[1][0] != verdict[1][1]
        rows.append({"drill": name, "facts": facts, "differs": differs})
    plan_differs = (plans[0] or {}).get("verdict") != (plans[1] or {}).get("verdict")
    return {
        "rows": rows,
        "plan_drill": plans,
        "differs": plan_differs or any(r["differs"] for r in rows),
        "note": "one run of each drill per pack: no run-to-run variation to judge a difference "
        "against; differing outcomes are flagged, not tested",
    }


def compare_closed_loop(a: Source, b: Source) -> list[dict[str, Any]]:
    rows = []
    ca, cb = a.capacity.get("closed_loop") or {}, b.capacity.get("closed_loop") or {}
    for state in sorted(set(ca) & set(cb)):
        pa = {p["concurrency"]: p for p in ca[state].get("curve", [])}
        pb = {p["concurrency"]: p for p in cb[state].get("curve", [])}
        for n in sorted(set(pa) & set(pb)):
            tps = [p[n].get("output_throughput_tps") for p in (pa, pb)]
            rows.append({"cache_state": state, "concurrency": n, "output_tps": tps,
                         "status": [pa[n].get("status"), pb[n].get("status")]})  # fmt: skip
        ops = [c[state].get("operating_point") or {} for c in (ca, cb)]
        rows.append({
            "cache_state": state, "concurrency": "operating point",
            "output_tps": [o.get("output_throughput_tps") for o in ops],
            "status": [f"c{o['concurrency']}" if o.get("concurrency") else "none" for o in ops],
        })  # fmt: skip
    return rows


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: obj}


def compare_manifests(a: Source, b: Source) -> dict[str, Any]:
    ma, mb = a.manifest, b.manifest
    out: dict[str, Any] = {"sha256": [a.manifest_sha256, b.manifest_sha256],
                           "from": [a.manifest_from, b.manifest_from]}  # fmt: skip
    if ma is None or mb is None:
        out.update(sections=[], fields=[], note="a manifest is missing: sections not compared")
        return out
    from capacity_pack.plan.manifest import SECTIONS

    names = [s for s in SECTIONS if s in ma or s in mb]
    names += sorted((set(ma) | set(mb)) - set(names))
    sections, fields = [], []
    for name in names:
        ha = sha256_of_obj(ma[name]) if name in ma else None
        hb = sha256_of_obj(mb[name]) if name in mb else None
        if ha == hb:
            continue
        sections.append({"section": name, "sha256": [ha, hb]})
        fa, fb = _flatten(ma.get(name), name), _flatten(mb.get(name), name)
        keys = [k for k in dict.fromkeys([*fa, *fb]) if fa.get(k) != fb.get(k)]
        fields.extend({"field": k, "values": [fa.get(k), fb.get(k)]}
                      for k in keys[:MAX_FIELDS_PER_SECTION])  # fmt: skip
        if len(keys) > MAX_FIELDS_PER_SECTION:
            fields.append({"field": f"{name}: {len(keys) - MAX_FIELDS_PER_SECTION} more",
                           "values": ["...", "..."]})  # fmt: skip
    out.update(sections=sections, fields=fields, note=None)
    return out


def identity(src: Source) -> dict[str, Any]:
    m = src.manifest or {}
    holds = src.capacity.get("holds_for") or {}
    engine = m.get("engine") or holds.get("engine") or {}
    model = m.get("model") or holds.get("model") or {}
    target = m.get("target") or {}
    tgt = target.get("profile") if target.get("kind") == "sim" else target.get("base_url")
    return {
        "origin": src.origin,
        "pack": src.name,
        "manifest_sha256": src.manifest_sha256,
        "engine": f"{engine.get('name', '?')} {engine.get('version', '?')}",
        "model": f"{model.get('id', '?')} @ {model.get('revision', '?')}",
        "target": f"{target.get('kind', '?')}: {tgt}" if target else None,
        "primary_cache_state": src.capacity.get("primary_cache_state"),
        "reports": src.reports_from or "none (capacity.json only)",
    }


# ---------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------


def compare_sources(a: Source, b: Source, confidence: float = 0.95) -> dict[str, Any]:
    """The whole comparison as data (rendered by :func:`to_markdown` and :func:`to_html`)."""
    if not 0.5 <= confidence < 1:
        raise CompareError(f"--confidence {confidence}: expected a value in [0.5, 1)")
    capacity = compare_capacity(a, b)
    att = attainment_rows(a, b)
    lat, pooled = latency_rows(a, b), latency_variation((a, b))
    tests = sum(1 for r in att if r["sides"][0]["successful"] and r["sides"][1]["successful"])
    tests += sum(
        1 for r in lat if r["eligible"]
        for m in r["metrics"].values() if None not in m["samples"]
    )  # fmt: skip
    each = 1 - (1 - confidence) / max(tests, 1)
    for r in att:
        _test_attainment(r, each)
    for r in lat:
        _test_latency(r, pooled, each)
    doc = {
        "a": identity(a),
        "b": identity(b),
        "confidence": confidence,
        "tests": tests,
        "per_test_confidence": each,
        "capacity": capacity,
        "attainment": att,
        "latency": lat,
        "latency_variation": pooled,
        "closed_loop": compare_closed_loop(a, b),
        "plan": compare_plan(a, b, capacity),
        "drills": compare_drills(a, b),
        "manifest": compare_manifests(a, b),
        "design_effect_known": [bool(a.reports), bool(b.reports)],
    }
    doc.update(verdict(doc, a, b))
    return doc


def _primary(doc: dict[str, Any], a: Source, b: Source) -> dict[str, Any] | None:
    both = [c for c in doc["capacity"] if c["in_both"]]
    for state in (a.capacity.get("primary_cache_state"), b.capacity.get("primary_cache_state")):
        hit = next((c for c in both if c["cache_state"] == state), None)
        if hit is not None:
            return hit
    return both[0] if both else None


def _carries(c: dict[str, Any]) -> str:
    """'B carries 30 % less than A (cold: 21 vs 30 RPS)' and its variants."""
    ca, cb = c["capacity_rps"]
    state = c["cache_state"]
    lowest = [_rps((s or {}).get("fail_rps")) for s in c["search_bracket"]]
    if ca is None and cb is None:
        return f"neither pack carries its SLOs at any rate tested ({state})"
    if cb is None:
        return (f"B carries nothing within its SLOs at the rates tested ({state}: below "
                f"{lowest[1]} RPS) where A carries {_rps(ca)} RPS")  # fmt: skip
    if ca is None:
        return (f"B carries {_rps(cb)} RPS where A carries nothing within its SLOs ({state}: "
                f"below {lowest[0]} RPS)")  # fmt: skip
    change = c["change"]
    if abs(change) < 0.005:
        return f"B carries as much as A ({state}: {_rps(ca)} RPS each)"
    word = "more" if change > 0 else "less"
    return (
        f"B carries {abs(change) * 100:.0f} % {word} than A ({state}: {_rps(cb)} vs {_rps(ca)} RPS)"
    )


def verdict(doc: dict[str, Any], a: Source, b: Source) -> dict[str, Any]:
    """The one-line summary and the list of what differs beyond run-to-run variation."""
    primary = _primary(doc, a, b)
    found = [f"{c['cache_state']} capacity" for c in doc["capacity"] if c["beyond"]]
    n_att = sum(r["beyond"] for r in doc["attainment"])
    n_lat = sum(m["beyond"] for r in doc["latency"] for m in r["metrics"].values())
    if n_att:
        found.append(f"{n_att} attainment{'s' if n_att > 1 else ''} at matched rates")
    if n_lat:
        found.append(f"{n_lat} P95 latenc{'ies' if n_lat > 1 else 'y'} at matched rates")
    carries = _carries(primary) if primary else "no cache state measured in both packs"
    if primary is not None and primary["beyond"]:
        line = f"{carries}: {BEYOND}"
    elif found:
        line = f"{carries}, {WITHIN}; beyond it: {', '.join(found)}"
    else:
        line = f"{NO_DIFFERENCE}: {carries}"
    return {"summary": line[0].upper() + line[1:], "beyond": bool(found),
            "beyond_what": found}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Rendering: one document model, written as Markdown or as HTML
# ---------------------------------------------------------------------------------------------


def _rps(x: Any) -> str:
    if x is None:
        return "none"
    if x == math.inf:
        return "∞"
    return f"{float(x):g}"


def _num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return str(x)


def _ms(x: float | None) -> str:
    return "—" if x is None else (f"{x:.0f}" if x >= 100 else f"{x:.3g}")


def _bracket(e: dict[str, Any] | None) -> str:
    return "—" if e is None else f"[{_rps(e['low'])}, {_rps(e['high'])})"


def _search(b: dict[str, Any] | None) -> str:
    if b is None:
        return "—"
    lo = b.get("pass_rps")
    return f"[{_rps(lo if lo is not None else 0)}, {_rps(b.get('fail_rps') or math.inf)})"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.0f} %"


# A block is ("h2", text) | ("p", text) | ("table", headers, rows, flags) | ("list", items);
# ``flags`` marks the rows whose difference is beyond variation (bold in Markdown, red in HTML).


def blocks(doc: dict[str, Any]) -> list[tuple]:
    out: list[tuple] = [("h1", "Capacity pack comparison: B against A"),
                        ("verdict", doc["summary"])]  # fmt: skip
    a, b = doc["a"], doc["b"]
    ident = [
        [label, _num(a[key]), _num(b[key])]
        for key, label in (("origin", "source"), ("pack", "pack"),
                           ("manifest_sha256", "manifest sha256"), ("engine", "engine"),
                           ("model", "model"), ("target", "target"),
                           ("primary_cache_state", "primary cache state"),
                           ("reports", "per-point reports"))
    ]  # fmt: skip
    out.append(("table", ["", "A", "B"], ident, [False] * len(ident)))
    if doc["beyond_what"]:
        out.append(("p", "Beyond run-to-run variation: " + "; ".join(doc["beyond_what"]) + "."))

    man = doc["manifest"]
    out.append(("h2", "What differs in the manifests"))
    if man["note"]:
        out.append(("p", man["note"]))
    elif not man["sections"]:
        same = ("The two packs' manifests are identical (every section's sha256 matches): "
                "any difference below is the runs', not the packs'.")  # fmt: skip
        out.append(("p", same))
    else:
        out.append(("p", "Sections whose sha256 differs: "
                    + ", ".join(f"`{s['section']}`" for s in man["sections"]) + "."))  # fmt: skip
        rows = [[f"`{f['field']}`", _short(f["values"][0]), _short(f["values"][1])]
                for f in man["fields"]]  # fmt: skip
        out.append(("table", ["field", "A", "B"], rows, [False] * len(rows)))

    out.append(("h2", "Capacity"))
    out.append(("p", "Evidence bracket [L, U): L the highest rate passing in every repeat with "
                "every lower rate passing, U the lowest rate above it that fails; disjoint "
                "evidence brackets are a difference beyond run-to-run variation. The search "
                "bracket is the pack's own [capacity, next tested rate)."))  # fmt: skip
    rows, flags = [], []
    for c in doc["capacity"]:
        ea, eb = c["evidence_bracket"]
        rows.append([c["cache_state"], _rps(c["capacity_rps"][0]), _rps(c["capacity_rps"][1]),
                     _pct(c["change"]), f"{_search(c['search_bracket'][0])} / "
                     f"{_search(c['search_bracket'][1])}", f"{_bracket(ea)} / {_bracket(eb)}",
                     _yes(c["beyond"]), c["note"]])  # fmt: skip
        flags.append(c["beyond"])
    out.append(("table", ["cache state", "A (RPS)", "B (RPS)", "B vs A", "search A / B",
                          "evidence A / B", "beyond variation", "why"], rows, flags))  # fmt: skip
    per = [[c["cache_state"], _num(c["per_replica_rps"][0]), _num(c["per_replica_rps"][1]),
            _num(c["goodput_per_gpu_rps"][0]), _num(c["goodput_per_gpu_rps"][1])]
           for c in doc["capacity"]]  # fmt: skip
    heads = ["cache state", "per replica A", "per replica B", "goodput per GPU A",
             "goodput per GPU B"]  # fmt: skip
    out.append(("table", heads, per, [False] * len(per)))

    out.append(("h2", "SLO attainment at matched rates"))
    known = doc["design_effect_known"]
    note = ("Attainment = requests meeting the class SLO / successful requests, pooled over the "
            "rate's deciding repeats; B − A with Newcombe's hybrid score interval at "
            f"{doc['per_test_confidence']:.4g} each ({doc['confidence']:g} over the "
            f"{doc['tests']} attainment and latency tests, Bonferroni), on effective samples "
            "(counts / the largest design effect of the rate's repeats).")  # fmt: skip
    if not all(known):
        which = " and ".join(x for x, k in zip("AB", known, strict=True) if not k)
        note += (f" No per-point reports for {which}: its design effect is taken as 1, which "
                 "overstates its precision when misses come in bursts.")  # fmt: skip
    out.append(("p", note))
    rows, flags = [], []
    for r in doc["attainment"]:
        sa, sb = r["sides"]
        rows.append([r["cache_state"], _rps(r["offered_rps"]), r["class"], _att(sa), _att(sb),
                     _pct_pts(r.get("difference")), _interval_pts(r.get("interval")),
                     _yes(r["beyond"]) if r.get("tested") else r.get("why") or "—"])  # fmt: skip
        flags.append(r["beyond"])
    if rows:
        out.append(("table", ["cache state", "RPS", "class", "A: met / ok (deff, status)",
                              "B: met / ok (deff, status)", "B − A", "interval",
                              "beyond variation"], rows, flags))  # fmt: skip
    else:
        out.append(("p", "No offered rate was measured by both packs."))

    out.append(("h2", "P95 latencies at matched rates"))
    pv = doc["latency_variation"]
    out.append(("p", "B / A of each class's P95 (mean of its repeats), against the "
                "between-repeat variation of log P95 pooled over both packs' repeated points "
                "(at rates that pack does not fail; tested where neither fails): "
                + "; ".join(f"{LATENCY_METRICS[m]} s = {_num(p['sd_log'])} over {p['df']} df"
                            if p["df"] else f"{LATENCY_METRICS[m]}: no repeated point"
                            for m, p in pv.items())
                + ". Cells: A → B ms (B / A, interval); beyond variation in bold."))  # fmt: skip
    rows, flags = [], []
    for r in doc["latency"]:
        cells = [_lat_cell(r["metrics"][m]) for m in LATENCY_METRICS]
        flag = any(r["metrics"][m]["beyond"] for m in LATENCY_METRICS)
        status = "/".join(s or "—" for s in r["statuses"])
        rows.append([r["cache_state"], _rps(r["offered_rps"]), r["class"], status, *cells])
        flags.append(flag)
    if rows:
        out.append(("table", ["cache state", "RPS", "class", "status A/B",
                              *LATENCY_METRICS.values()], rows, flags))  # fmt: skip

    if doc["closed_loop"]:
        out.append(("h2", "Closed loop"))
        out.append(("p", "Output tokens/s per concurrency, side by side (not tested)."))
        rows = [[r["cache_state"], str(r["concurrency"]), _num(r["output_tps"][0], 4),
                 _num(r["output_tps"][1], 4), _ratio_text(*r["output_tps"]),
                 f"{r['status'][0]} / {r['status'][1]}"] for r in doc["closed_loop"]]  # fmt: skip
        out.append(("table", ["cache state", "concurrency", "A tok/s", "B tok/s", "B / A",
                              "status A / B"], rows, [False] * len(rows)))  # fmt: skip

    plan = doc["plan"]
    out.append(("h2", "Replica plan"))
    out.append(("p", plan["note"][0].upper() + plan["note"][1:] + "."))
    rows = [[r["label"], _num(r["values"][0], 4), _num(r["values"][1], 4),
             "differs" if r["differs"] else ""] for r in plan["rows"]]  # fmt: skip
    if rows:
        out.append(("table", ["", "A", "B", ""], rows, [False] * len(rows)))

    dr = doc["drills"]
    out.append(("h2", "Failure drills"))
    out.append(("p", dr["note"][0].upper() + dr["note"][1:] + "."))
    if dr["plan_drill"] is not None:
        pa, pb = ((p or {}) for p in dr["plan_drill"])
        out.append(("table", ["plan drill (N+1)", "A", "B"],
                    [["verdict", pa.get("verdict", "none"), pb.get("verdict", "none")],
                     ["sentence", pa.get("sentence", "—"), pb.get("sentence", "—")]],
                    [False, False]))  # fmt: skip
    rows = []
    for r in dr["rows"]:
        fa, fb = (f or {} for f in r["facts"])
        rows.append([f"`{r['drill']}`", _drill(fa), _drill(fb), "differs" if r["differs"] else ""])
    if rows:
        out.append(("table", ["drill", "A", "B", ""], rows, [False] * len(rows)))

    out.append(("h2", "Method"))
    out.append(("list", METHOD_LINES))
    return out


METHOD_LINES = [
    "Capacity: disjoint evidence brackets [highest pass, lowest fail) per cache state; a rate "
    "left inconclusive, marginal or inconsistent bounds nothing.",
    "Attainment: Newcombe's hybrid score interval (Wilson intervals of each side) for the "
    "difference of proportions, at effective samples (design effect).",
    "P95 latency: log-ratio against the pooled between-repeat standard deviation of log P95 "
    "(Student t); only at rates neither pack fails.",
    "All attainment and latency tests together hold the family-wise confidence (Bonferroni).",
    "Plan and drills are compared side by side and flagged when they differ; they are not "
    "tested (the plan follows from the capacity; each drill runs once).",
    "docs/metrics.md, 'Comparing two packs', states the method in full.",
]


def _short(v: Any, limit: int = 80) -> str:
    text = "—" if v is None else (json.dumps(v) if not isinstance(v, str) else v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _yes(flag: bool) -> str:
    return "**yes**" if flag else "no"


def _att(s: dict[str, Any]) -> str:
    if not s["successful"]:
        return f"— ({s['status']})"
    deff = f"deff {s['design_effect']:.2g}" if s["design_effect_known"] else "deff 1 (assumed)"
    return f"{s['passing']} / {s['successful']} = {s['passing'] / s['successful']:.3f} " \
           f"({deff}, {s['status']})"  # fmt: skip


def _pct_pts(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.1f} pts"


def _interval_pts(ci: list[float] | None) -> str:
    return "—" if ci is None else f"[{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}] pts"


def _lat_cell(m: dict[str, Any]) -> str:
    sa, sb = m["samples"]
    if sa is None or sb is None:
        return "—"
    text = f"{_ms(sa.mean)} → {_ms(sb.mean)} (×{m['ratio']:.2f}"
    if m.get("interval"):
        text += f", [{m['interval'][0]:.2f}, {m['interval'][1]:.2f}]"
    text += ")"
    if not m["tested"]:
        text += " untested"
    return f"**{text}**" if m["beyond"] else text


def _ratio_text(a: float | None, b: float | None) -> str:
    return "—" if not a or b is None else f"×{b / a:.2f}"


def _drill(f: dict[str, Any]) -> str:
    if not f:
        return "not run"
    if "recovered" not in f:
        return f["outcome"]
    parts = [f["outcome"], "recovered" if f["recovered"] else "not recovered"]
    if f.get("detected_after_s") is not None:
        parts.append(f"detected +{f['detected_after_s']:.1f} s")
    parts.append(f"{_num(f.get('rejected'))} rejected, {_num(f.get('lost'))} lost")
    return ", ".join(parts)


def to_markdown(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    for block in blocks(doc):
        kind = block[0]
        if kind == "h1":
            lines += [f"# {block[1]}", ""]
        elif kind == "verdict":
            lines += [f"**{block[1]}**", ""]
        elif kind == "h2":
            lines += [f"## {block[1]}", ""]
        elif kind == "p":
            lines += [block[1], ""]
        elif kind == "list":
            lines += [f"- {item}" for item in block[1]] + [""]
        elif kind == "table":
            _, headers, rows, _flags = block
            lines.append("| " + " | ".join(headers) + " |")
            lines.append("|" + "---|" * len(headers))
            lines += ["| " + " | ".join(_cell_md(c) for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


def _cell_md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:80em;
color:#1d1d1f;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
.verdict{font-size:1.15em;font-weight:600;padding:.7em 1em;border-radius:6px;background:#eef6ee;
border:1px solid #9c9}
.verdict.beyond{background:#fdeeee;border-color:#d99}
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.92em}
th,td{border:1px solid #ccc;padding:.3em .55em;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr.beyond td{background:#fdeeee}
code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.95em}
"""


def _inline_html(text: str) -> str:
    """Escape, then render the two Markdown marks the blocks use: **bold** and `code`."""
    out = html.escape(str(text))
    parts = out.split("**")
    out = "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))
    parts = out.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def to_html(doc: dict[str, Any]) -> str:
    """A self-contained page: inline CSS, no script, nothing fetched."""
    body: list[str] = []
    for block in blocks(doc):
        kind = block[0]
        if kind == "h1":
            body.append(f"<h1>{_inline_html(block[1])}</h1>")
        elif kind == "verdict":
            cls = "verdict beyond" if doc["beyond"] else "verdict"
            body.append(f'<p class="{cls}" id="verdict">{html.escape(block[1])}</p>')
        elif kind == "h2":
            body.append(f"<h2>{_inline_html(block[1])}</h2>")
        elif kind == "p":
            body.append(f"<p>{_inline_html(block[1])}</p>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in block[1]) + "</ul>")
        elif kind == "table":
            _, headers, rows, flags = block
            head = "".join(f"<th>{_inline_html(h)}</th>" for h in headers)
            trs = [
                ('<tr class="beyond">' if flag else "<tr>")
                + "".join(f"<td>{_inline_html(c)}</td>" for c in row) + "</tr>"
                for row, flag in zip(rows, flags, strict=True)
            ]  # fmt: skip
            body.append(
                f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(trs)}</tbody></table>"
            )
    title = html.escape(f"capacity-pack compare: {doc['a']['pack']} vs {doc['b']['pack']}")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, LogSample):
        return _jsonable(obj.__dict__)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


# ---------------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------------


def run_compare(
    a: str,
    b: str,
    *,
    tracking: str | None = None,
    confidence: float = 0.95,
    markdown: str | os.PathLike[str] | None = None,
    html_path: str | os.PathLike[str] | None = None,
    json_path: str | os.PathLike[str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Compare pack ``b`` against pack ``a`` (folders or ``mlflow:<run id>``); write the
    Markdown, HTML and JSON where asked. Returns the Markdown and the comparison."""
    with open_sources(a, b, tracking) as (sa, sb):
        doc = compare_sources(sa, sb, confidence)
    text = to_markdown(doc)
    if markdown is not None:
        write_text_atomic(markdown, text)
    if html_path is not None:
        write_text_atomic(html_path, to_html(doc))
    if json_path is not None:
        write_json_atomic(json_path, _jsonable(doc))
    return text, doc
