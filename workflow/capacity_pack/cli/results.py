"""Commands that read results: a requests.csv's SLO report, a run's autopsy, the comparison of
two packs, and the twin's what-if predictions."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from capacity_pack.cli.common import Fail, die_on_manifest_error, echo_json, quiet_log, stage_entry


@click.command()
@click.argument("requests_csv", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("duration_seconds", type=float)
@click.argument("queue_trend")
@click.option(
    "--manifest",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help=(
        "Take classes, cutoffs and gates from this pack (default: interactive 500/40 ms, 128 "
        "tokens; long_context 2500/50 ms, 256; generation_heavy 800/45 ms, 1024; gates 0.95 "
        "attainment, 2,000 successes per class, 1% errors)."
    ),
)
def analyze(
    requests_csv: Path, duration_seconds: float, queue_trend: str, manifest: Path | None
) -> None:
    """Per-class SLO report and capacity gate of a requests.csv (prints JSON).

    REQUESTS_CSV has columns request_id, class, ttft_ms, tpot_ms, e2e_ms, output_tokens, status,
    and optionally output_tokens_expected (each row's scheduled output length, which a
    successful row must match; a pack's own requests.csv has it);
    DURATION_SECONDS is the whole cohort's window; QUEUE_TREND is flat or growing. A successful
    request passes when its TTFT and TPOT are within its class's cutoffs; a class passes with
    attainment >= the gate over at least the minimum successful rows; the capacity gate also
    needs the global error rate within its cap and a flat queue. Percentiles are nearest-rank;
    P99 is withheld for a class with fewer successful rows than its sample gate (10,000).

    The JSON report holds counts, error rate, goodput and throughputs, the gate verdicts,
    and per class its counts, attainment and percentiles.
    """
    # Also answered without this module (capacity_pack.quick_commands) when no option is given.
    from capacity_pack.quick_commands import analyze_json

    click.echo(analyze_json(requests_csv, duration_seconds, queue_trend, manifest))


@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--results",
    "results_root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("results"),
    show_default=True,
    help="Results root holding <pack name>/ and mlflow.db.",
)
@click.option(
    "--log-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path(".snakemake/log"),
    show_default=True,
    help="Snakemake's main logs of the run.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Write autopsy.md here (and autopsy.json beside it).",
)
@die_on_manifest_error
def autopsy(config: Path, results_root: Path, log_dir: Path, output: Path) -> None:
    """Performance autopsy of CONFIG's last measuring run: where the wall clock and each SLO
    miss went."""
    from capacity_pack.plan.manifest import load_pack

    pack = load_pack(config)
    results = results_root / pack.pack.name
    if not results.is_dir():
        raise Fail(f"{results}: no results for pack {pack.pack.name!r}; run the pipeline first")
    stage_entry("autopsy")(
        pack=pack,
        results_dir=results,
        log_dir=log_dir,
        repo_dir=Path.cwd(),
        markdown=output,
        json_path=output.with_suffix(".json"),
        log=quiet_log(),
    )
    click.echo(f"{output}, {output.with_suffix('.json')}")


#: ``compare --exit-code``: the status when a difference exceeds run-to-run variation (1 is an
#: error, 2 a usage error).
COMPARE_DIFFERS_STATUS = 3


@click.command()
@click.argument("pack_a")
@click.argument("pack_b")
@click.option(
    "--tracking-uri",
    default=None,
    help="MLflow store of mlflow:<run id> sources (default: $MLFLOW_TRACKING_URI, else "
    "results/mlflow.db here).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the Markdown here instead of standard output.",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a self-contained HTML page here.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the comparison as JSON here.",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0.5, 1, max_open=True),
    default=0.95,
    show_default=True,
    help="Family-wise confidence of the attainment and latency tests.",
)
@click.option(
    "--exit-code",
    is_flag=True,
    help=f"Exit {COMPARE_DIFFERS_STATUS} when a difference exceeds run-to-run variation.",
)
def compare(
    pack_a: str,
    pack_b: str,
    tracking_uri: str | None,
    output: Path | None,
    html_path: Path | None,
    json_path: Path | None,
    confidence: float,
    exit_code: bool,
) -> None:
    """Compare pack B against pack A and say whether they differ beyond run-to-run variation.

    PACK_A and PACK_B are results folders (results/<pack> or its pack/ subfolder) or MLflow
    parent runs (mlflow:<run id>). The capacity per cache state, each class's attainment and P95
    latencies at the rates both measured, the plan, the drills and the manifest fields that
    differ, with the verdict on the first line; the method is in docs/metrics.md.
    """
    from capacity_pack.decide.compare import run_compare

    text, doc = run_compare(
        pack_a,
        pack_b,
        tracking=tracking_uri,
        confidence=confidence,
        markdown=output,
        html_path=html_path,
        json_path=json_path,
    )
    if output is None:
        click.echo(text, nl=False)
    else:
        click.echo(f"{doc['summary']}\n{output}" + (f", {html_path}" if html_path else ""))
    if exit_code and doc["beyond"]:
        sys.exit(COMPARE_DIFFERS_STATUS)


# Over 80 lines only with its options: a click command's options are its signature.
@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--mix",
    "mix_items",
    multiple=True,
    metavar="CLASS=SHARE",
    help="A class's new share; the other classes keep their relative shares. Repeatable.",
)
@click.option("--replicas", type=int, default=None, help="Run the fleet with this many replicas.")
@click.option("--max-num-seqs", type=int, default=None, help="The engine's running-sequence cap.")
@click.option(
    "--max-num-batched-tokens", type=int, default=None, help="The engine's token budget per step."
)
@click.option(
    "--rate",
    "rates",
    type=float,
    multiple=True,
    help="Predict these open-loop rates (RPS) instead of the capacity bracket. Repeatable.",
)
@click.option(
    "--cache-state",
    "cache_states",
    type=click.Choice(["cold", "warm"]),
    multiple=True,
    help="Only these cache states (default: the pack's).",
)
@click.option(
    "--profile",
    default=None,
    help="Engine model to predict on (profile name or YAML); default: the pack's calibrated "
    "twin (results/<pack>/twin/profile.yaml), else a simulated target's own profile.",
)
@click.option(
    "--results",
    "results_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("results"),
    show_default=True,
    help="Results root holding <pack name>/twin/.",
)
@click.option(
    "--allow-untrusted",
    is_flag=True,
    help="Predict with a twin whose validation error exceeds its tolerance (labelled so).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@die_on_manifest_error
def whatif(
    config: Path,
    mix_items: tuple[str, ...],
    replicas: int | None,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    rates: tuple[float, ...],
    cache_states: tuple[str, ...],
    profile: str | None,
    results_root: Path,
    allow_untrusted: bool,
    as_json: bool,
) -> None:
    """Ask the twin what CONFIG's pack would show with one thing changed: a prediction in
    virtual time, printed next to the twin's validation error."""
    from capacity_pack.plan.manifest import load_pack
    from capacity_pack.twin.whatif import Changes, answer, answer_lines, find_twin, parse_mix

    pack = load_pack(config)
    changes = Changes(
        mix=parse_mix(mix_items),
        replicas=replicas,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    twin = find_twin(pack, results_root / pack.pack.name, profile)
    if twin.trusted is False and not allow_untrusted:
        raise Fail(
            f"{twin.words()}: an untrusted twin's predictions are not used; "
            "--allow-untrusted prints them anyway, labelled"
        )
    doc = answer(pack, changes, twin, rates=list(rates), cache_states=list(cache_states))
    if as_json:
        echo_json(doc)
        return
    for line in answer_lines(doc):
        click.echo(line)
