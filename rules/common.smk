# Paths, point lists and the params that decide what reruns.
#
# Manifest-derived params are given as functions: Snakemake formats a string param with the
# job's wildcards, and a manifest may hold literal braces (a managed target's "{port}").
#
# A rule's params carry exactly the manifest content it reads (or its sha256) and the hash of
# the code it runs (code_hash below), so a change reruns only the stages that read it. Compute
# rules do not take the frozen manifest as an input: every manifest change reruns `freeze`, and
# Snakemake 9.27 marks every job downstream of a rerun job as needing a rerun, or (for ancient()
# inputs) skips the job's own params check entirely. The MLflow child runs of a stage are logged
# by a cheap `track_<stage>` job that does depend on the frozen manifest, so every new parent run
# gets a child per job while the measurements themselves are reused.
from capacity_pack import codehash
from capacity_pack.evidence import analysis as analysis_lib
from capacity_pack.measure import cluster as cluster_lib
from capacity_pack.drills import analyze as drill_analyze_lib
from capacity_pack.drills import plan as drill_plan_lib
from capacity_pack.plan import schedule as schedule_lib
from capacity_pack.track import tracking as tracking_lib
from capacity_pack.measure import sweep as sweep_lib
from capacity_pack.io import canonical_json

RESULTS_ROOT = "results"
RESULTS = f"{RESULTS_ROOT}/{PACK.pack.name}"
FROZEN = f"{RESULTS}/manifest/frozen.json"
MANIFEST_JSON = canonical_json(PACK.model_dump(mode="json"))
POINTS = schedule_lib.points(PACK)
ANALYSIS_SPEC_JSON = analysis_lib.AnalysisSpec.of(PACK).canonical_json()
# The decision reads gates, workload, placement, plan and target: it is cheap, so it takes the
# whole validated pack (a script never reads the config itself) except the failure drills,
# which come after it: a changed drill setting must not re-decide capacity (and, through the
# decision's file, re-run every drill).
CAPACITY_INPUTS_JSON = canonical_json(PACK.model_dump(mode="json", exclude={"failure"}))
AUTOPSY_MD = f"{RESULTS}/pack/autopsy.md"
# The resource every measurement job holds one unit of: named after the target, so the limit
# of 1 (set in the Snakefile) is per target, not one slot shared by every target.
TARGET_RESOURCE = cluster_lib.target_resource(PACK)
PACK_PLOTS = ["throughput.png", "attainment.png", "latency.png"]
if PACK.sweep.closed_loop_concurrency:
    PACK_PLOTS.append("closed_loop.png")
if PACK.sweep.open_loop_rps:
    PACK_PLOTS.append("timeseries.png")


wildcard_constraints:
    point=r"open-r[0-9.]+|closed-c[0-9]+|exp-[a-z][a-z0-9_]*",
    cache=r"cold|warm",
    repeat=r"[0-9]+",
    stage=r"[a-z_]+",
    drill=r"[a-z][a-z0-9_]*",


# Parsed files' hashes, kept beside Snakemake's own metadata: a parse re-reads only changed files.
codehash.use_cache_file(".snakemake/codehash.json")
# A measurement against the simulated target also runs it, as `python -m capacity_pack.sim`.
SIM_ENGINE = ["capacity_pack.sim.__main__"] if PACK.target.kind == "sim" else []


def code_hash(script, *modules):
    """Hash of the code a rule's job runs: scripts/<script> and every library module it imports,
    transitively, plus `modules` and theirs (capacity_pack.codehash). A real change there
    reruns the job; a comment or docstring does not."""
    return codehash.code_hash(Path(workflow.basedir) / "scripts" / script, *modules)


def wildcard_point(wildcards):
    return schedule_lib.Point.parse(wildcards.point, wildcards.cache, int(wildcards.repeat))


def schedule_inputs_json(wildcards):
    """The manifest content one point's schedule reads, as canonical JSON."""
    return schedule_lib.ScheduleInputs.for_point(PACK, wildcard_point(wildcards)).canonical_json()


def results_root(wildcards, output):
    """The results root (MLflow store location) above this pack's output folder."""
    return output[0].split(f"/{PACK.pack.name}/")[0]


def sweep_inputs_json(wildcards):
    """The manifest content one measurement reads, as canonical JSON."""
    return sweep_lib.SweepInputs.for_point(PACK, wildcard_point(wildcards)).canonical_json()


def sweep_threads(wildcards):
    """One core per client process: client.shards for open-loop points, 1 for closed loop."""
    return PACK.client.shards if wildcard_point(wildcards).mode != "closed" else 1


def point_dir(kind, point):
    return f"{RESULTS}/{kind}/{point.point_id}/{point.cache_state}/rep{point.repeat}"


def schedule_targets():
    return [f"{point_dir('schedules', p)}/summary.json" for p in POINTS]


def sweep_targets():
    return [f"{point_dir('raw', p)}/summary.json" for p in POINTS]


def table_targets():
    return [f"{point_dir('tables', p)}/summary.json" for p in POINTS]


def report_targets():
    return [f"{point_dir('reports', p)}/slo-report.json" for p in POINTS]


def open_report_targets():
    return [f"{point_dir('reports', p)}/slo-report.json" for p in POINTS if p.mode == "open"]


# Failure drills: their names, what each reads, and what analysing them reads.
DRILLS = [d.name for d in PACK.failure.drills] if PACK.failure else []
DRILL_SPEC_JSON = drill_analyze_lib.DrillAnalysisSpec.of(PACK).canonical_json()
PACK_INFO_JSON = canonical_json({**PACK.pack.model_dump(mode="json"), "label": PACK.pack.label})
# The alert rules read the engine name, cutoffs, gates and thresholds; the rule is cheap, so it
# takes the whole pack (a changed pack rewrites the rules; the drills are not re-run).
DASHBOARD_INPUTS_JSON = MANIFEST_JSON


def drill_inputs_json(wildcards):
    return drill_plan_lib.DrillInputs.for_drill(PACK, wildcards.drill).canonical_json()


def drill_report_targets():
    return [f"{RESULTS}/failure/{d}/drill-report.json" for d in DRILLS]


# Stages whose jobs get MLflow child runs, and the summaries each job writes.
TRACKED_STAGES = {
    "schedule": schedule_targets,
    "sweep": sweep_targets,
    "analysis": report_targets,
}
if DRILLS:
    TRACKED_STAGES["failure"] = drill_report_targets


def all_targets():
    return [
        FROZEN,
        *schedule_targets(),
        *sweep_targets(),
        *table_targets(),
        *report_targets(),
        *(f"{RESULTS}/tracking/{stage}.json" for stage in TRACKED_STAGES),
        f"{RESULTS}/pack/README.md",
        *([f"{RESULTS}/pack/failure-test.md"] if DRILLS else []),
        f"{RESULTS}/pack/dashboard/grafana-dashboard.json",
    ]
