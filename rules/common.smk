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
from capacity_pack.measure import inputs as sweep_inputs_lib
from capacity_pack.io import canonical_json
from capacity_pack import stages as stages_lib

RESULTS_ROOT = "results"
RESULTS = f"{RESULTS_ROOT}/{PACK.pack.name}"


# Every stage's file names come from the stage table (capacity_pack.stages), with the rules'
# wildcards ({point}/{cache}/rep{repeat}, {drill}, {stage}) left for Snakemake.
def stage_outputs(name):
    """Every output of stage `name` by output name: a rule's `output: **stage_outputs(name)`."""
    return stages_lib.STAGES[name].output_paths(RESULTS)


def stage_output(name, key, **wildcards):
    """Output `key` of stage `name`; the wildcards given are filled in."""
    return stages_lib.STAGES[name].output(key, RESULTS, **wildcards)


def point_output(name, key, point):
    """Output `key` of stage `name` for one point of the pack."""
    return stage_output(name, key, **stages_lib.point_wildcards(point))


FROZEN = stage_output("freeze", "frozen")
MANIFEST_JSON = canonical_json(PACK.model_dump(mode="json"))
POINTS = schedule_lib.points(PACK)
ANALYSIS_SPEC_JSON = analysis_lib.AnalysisSpec.of(PACK).canonical_json()
# The decision reads gates, workload, placement, plan and target: it is cheap, so it takes the
# whole validated pack (a script never reads the config itself) except the failure drills,
# which come after it: a changed drill setting must not re-decide capacity (and, through the
# decision's file, re-run every drill).
CAPACITY_INPUTS_JSON = canonical_json(PACK.model_dump(mode="json", exclude={"failure"}))
AUTOPSY_MD = stage_output("autopsy", "markdown")
# The resource every measurement job holds one unit of: named after the target, so the limit
# of 1 (set in the Snakefile) is per target, not one slot shared by every target.
TARGET_RESOURCE = cluster_lib.target_resource(PACK)
PACK_PLOTS = stages_lib.report_plots(PACK.sweep)


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


def stage_code_hash(name, *modules):
    """code_hash of stage `name`: its rule script, which imports only the job log and the stage
    table, plus the stage's entry module, which the script resolves by name and so no import
    walk sees (capacity_pack.stages), plus `modules`."""
    return code_hash(f"{name}.py", stages_lib.STAGES[name].entry_module, *modules)


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
    return sweep_inputs_lib.SweepInputs.for_point(PACK, wildcard_point(wildcards)).canonical_json()


def sweep_threads(wildcards):
    """One core per client process: client.shards for open-loop points, 1 for closed loop."""
    return PACK.client.shards if wildcard_point(wildcards).mode != "closed" else 1


def point_targets(name, key, points=None):
    """Output `key` of stage `name` for every point (or each of `points`)."""
    return [point_output(name, key, p) for p in (POINTS if points is None else points)]


def schedule_targets():
    return point_targets("schedule", "summary")


def sweep_targets():
    return point_targets("sweep", "summary")


def table_targets():
    return point_targets("normalize", "summary")


def report_targets():
    return point_targets("analyze", "report")


def open_report_targets():
    return point_targets("analyze", "report", [p for p in POINTS if p.mode == "open"])


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
    return [stage_output("failure_analyze", "report", drill=d) for d in DRILLS]


def tracked_targets(tracked):
    """The summaries the jobs of the stage tracked as `tracked` write (one per point or drill)."""
    stage = stages_lib.TRACKED[tracked]
    if "{drill}" in stage.folder:
        return [stage.output(stage.summary, RESULTS, drill=d) for d in DRILLS]
    return point_targets(stage.name, stage.summary)


# Stages whose jobs get MLflow child runs (those with jobs in this pack), by track job name.
TRACKED_STAGES = [t for t in stages_lib.TRACKED if tracked_targets(t)]


def tracked_record_module(tracked):
    """The module of the tracked stage's record function: the track job runs it too."""
    return stages_lib.TRACKED[tracked].record_module


def all_targets():
    return [
        FROZEN,
        *schedule_targets(),
        *sweep_targets(),
        *table_targets(),
        *report_targets(),
        *(stage_output("track", "runs", stage=stage) for stage in TRACKED_STAGES),
        stage_output("report", "readme"),
        *([stage_output("failure_test", "markdown")] if DRILLS else []),
        stage_output("dashboard", "dashboard"),
    ]
