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
import glob
import json

from capacity_pack import codehash
from capacity_pack.decide import search as search_lib
from capacity_pack.decide import shapes as shapes_lib
from capacity_pack.evidence import analysis as analysis_lib
from capacity_pack.measure import cluster as cluster_lib
from capacity_pack.drills import analyze as drill_analyze_lib
from capacity_pack.drills import plan as drill_plan_lib
from capacity_pack.twin import calibrate as twin_calibrate_lib
from capacity_pack.plan import schedule as schedule_lib
from capacity_pack.plan import prepared as prepared_lib
from capacity_pack.measure import inputs as sweep_inputs_lib
from capacity_pack.io import canonical_json, sha256_hex, user_cache_dir
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
# The points the manifest fixes. With sweep.search, the searched points are decided round by
# round (rules/search.smk): every target list below is then a function of the search's
# checkpoints, to be called from an input function only.
POINTS = schedule_lib.points(PACK)
SEARCH = PACK.sweep.search
# What every point's prompts read beyond its schedule (the tokenizer file by its sha256).
PROMPT_INPUTS_JSON = prepared_lib.PromptInputs.of_pack(PACK).canonical_json()
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
# The target's chain (schedules, measurements, the analyses and decisions that choose the next
# measurement, the drills) goes before bookkeeping (MLflow tracking, plots) when both are ready:
# a free core goes to what the target waits for. Measured: at the end of the default pack's
# search three tracking jobs took both cores for 5 s while the capacity decision, and so the
# first drill, waited.
CHAIN_PRIORITY = 1
PACK_PLOTS = stages_lib.report_plots(PACK.sweep)


wildcard_constraints:
    point=r"open-r[0-9.]+|closed-c[0-9]+|exp-[a-z][a-z0-9_]*",
    cache=r"cold|warm",
    repeat=r"[0-9]+",
    round=r"[1-9][0-9]*",
    stage=r"[a-z_]+",
    drill=r"[a-z][a-z0-9_]*",


# Parsed files' hashes, kept on disk under their content and shared by every work directory: a
# parse re-reads every file and parses only changed ones, in a new work directory too.
codehash.use_cache_file(user_cache_dir() / "codehash.json")
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


def control_inputs_json(wildcards):
    """The engine model's part in one point's analysis (capacity_pack.twin.control: a
    simulated target's open-loop point gets the model as control variate), as canonical JSON;
    "" where it does not apply. Imported here, not at the top: most packs never need it."""
    from capacity_pack.twin import control as control_lib

    inputs = control_lib.ControlInputs.for_point(PACK, wildcard_point(wildcards))
    return "" if inputs is None else inputs.canonical_json()


def results_root(wildcards, output):
    """The results root (MLflow store location) above this pack's output folder."""
    return output[0].split(f"/{PACK.pack.name}/")[0]


def gate_from_config(wildcards):
    """Whether the point's in-run decision reads its attainment gate from the invocation's
    config rather than from its params: in a searching pack, a point decided while it runs
    (open-loop rate points on one client process). A changed gate then re-analyzes and
    re-decides the search, which measures again only the rates whose points it leaves
    undecided; it never re-measures a point (its confidence sequence holds at any stopping
    time). A fixed grid has no search to measure an undecided point again: there the gate is
    in the params, and a changed gate measures the open-loop rate points again. (Not an
    `ancient` input file: Snakemake then skipped the checkpoint rounds a changed
    `max_rounds` asked for in the same invocation.)"""
    point = wildcard_point(wildcards)
    return SEARCH is not None and (
        sweep_inputs_lib.SweepInputs.decided_in_run(PACK, point) is not None
    )


def sweep_inputs_json(wildcards):
    """The manifest content one measurement reads, as canonical JSON (less the in-run gate
    when the point reads it from the config: gate_from_config)."""
    inputs = sweep_inputs_lib.SweepInputs.for_point(PACK, wildcard_point(wildcards))
    return (inputs.without_gate() if gate_from_config(wildcards) else inputs).canonical_json()


# A measurement of a target on this host runs alone (capacity_pack.measure.cluster, isolation).
LOCAL_TARGET = cluster_lib.local_target(PACK)


def measure_threads(client_processes=1):
    """A local target's measurement takes every core of the invocation, so no other job runs
    beside it; a remote one, one core per client process."""
    if not LOCAL_TARGET:
        return client_processes
    try:
        return max(client_processes, workflow.cores)
    except WorkflowError:  # no --cores (a lint or a listing): nothing is scheduled
        return client_processes


def sweep_threads(wildcards):
    """One core per client process (client.shards for open-loop points, 1 for closed loop);
    every core for a local target (measure_threads)."""
    return measure_threads(PACK.client.shards if wildcard_point(wildcards).mode != "closed" else 1)


def all_points():
    """The fixed points, then every searched point (call from an input function only)."""
    return POINTS + searched_points() if SEARCH is not None else POINTS


def point_targets(name, key, points=None):
    """Output `key` of stage `name` for every point (or each of `points`)."""
    return [point_output(name, key, p) for p in (all_points() if points is None else points)]


def report_targets():
    return point_targets("analyze", "report")


def open_report_targets():
    return point_targets("analyze", "report", [p for p in all_points() if p.mode == "open"])


# Load-shape experiments (rules/shapes.smk): their points, what their answers read, the plots.
EXP_POINTS = [p for p in POINTS if p.mode == "exp"]
SHAPES_INPUTS_JSON = shapes_lib.ShapesInputs.of(PACK).canonical_json()


def shape_plot_targets():
    """Each experiment's picture beside the README (none without experiments)."""
    folder = Path(stage_output("shapes", "json")).parent
    return [str(folder / f"shape-{e.name}.png") for e in PACK.experiments] if EXP_POINTS else []


def shapes_targets():
    """shapes.json when the pack has experiments (the report's input)."""
    return [stage_output("shapes", "json")] if EXP_POINTS else []


# Failure drills: their names, what each reads, and what analysing them reads.
DRILLS = [d.name for d in PACK.failure.all_drills] if PACK.failure else []
DRILL_SPEC_JSON = drill_analyze_lib.DrillAnalysisSpec.of(PACK).canonical_json()
PACK_INFO_JSON = canonical_json({**PACK.pack.model_dump(mode="json"), "label": PACK.pack.label})
# The alert rules read the engine name, cutoffs, gates and thresholds; the rule is cheap, so it
# takes the whole pack (a changed pack rewrites the rules; the drills are not re-run).
DASHBOARD_INPUTS_JSON = MANIFEST_JSON


# Why the pack has no validated twin (None: it has one): a real target's plan drill says it.
TWIN_ABSENT = twin_calibrate_lib.twin_absent_reason(PACK)


def drill_inputs_json(wildcards):
    inputs = drill_plan_lib.DrillInputs.for_drill(PACK, wildcards.drill, TWIN_ABSENT)
    return inputs.canonical_json()


def capacity_decided(wildcards=None):
    """Nothing, once the capacity checkpoint has run (rules/capacity.smk); until then Snakemake
    holds back the asking job (checkpoints.capacity.get() raises).

    A drill reads the decision's numbers (drill_numbers_json), not its files: a decision rerun
    by an analysis edit re-measures a drill only if its numbers moved. A dry run cannot know
    what a rerun decision will say: where the decision on disk was made on the pack settings of
    this invocation (capacity.json's inputs_sha256), it judges the drills on that decision, so
    `snakemake -n` after an analysis-code edit lists no drill; after a settings change it lists
    every drill as pending the checkpoint. A re-measurement by a measuring-code edit is the
    gap: the dry run shows the drills as they stand, the run re-judges them on the new
    decision."""
    if not (workflow.dryrun and decided_on_these_settings()):
        checkpoints.capacity.get()
    return []


def decided_on_these_settings():
    decided = [Path(stage_output("capacity", "capacity")), Path(stage_output("capacity", "plan"))]
    if not all(p.exists() for p in decided):
        return False
    try:
        digest = json.loads(decided[0].read_text()).get("inputs_sha256")
    except (ValueError, AttributeError):
        return False
    return digest == sha256_hex(CAPACITY_INPUTS_JSON)


def decided_open_reports():
    """The open-loop SLO reports the decision read: the search's points once its checkpoints
    have run; in a dry run on a finished pack, those on disk (the rounds may be pending)."""
    if workflow.dryrun:
        pattern = stage_output("analyze", "report", point="open-r*", cache="*", repeat="*")
        return sorted(glob.glob(pattern))
    return open_report_targets()


def drill_numbers_json(wildcards):
    """The numbers drill `wildcards.drill` takes from the decision, as canonical JSON
    (capacity_pack.drills.plan.DrillNumbers)."""
    capacity_decided()
    inputs = drill_plan_lib.DrillInputs.for_drill(PACK, wildcards.drill, TWIN_ABSENT)
    numbers = drill_plan_lib.DrillNumbers.from_files(
        inputs,
        stage_output("capacity", "capacity"),
        decided_open_reports(),
        stage_output("capacity", "plan"),
    )
    return numbers.canonical_json()


def plan_drill_twin(wildcards):
    """The plan drill of a real target whose pack plans a validated twin (TWIN_TARGETS,
    rules/twin.smk): the calibrated profile and its validation, on which a plan too large to run
    live is predicted (capacity_pack.drills.plan). Every other drill, and a simulated target's
    plan drill, waits for no twin (an input function: TWIN_TARGETS is set after this file)."""
    plan = wildcards.drill == drill_plan_lib.PLAN_DRILL
    if not plan or PACK.target.kind == "sim" or not TWIN_TARGETS:
        return {}
    return {
        "twin_profile": stage_output("calibrate", "profile"),
        "twin_validation": stage_output("twin_validate", "validation"),
    }


def drill_report_targets():
    return [stage_output("failure_analyze", "report", drill=d) for d in DRILLS]


def drill_timeline_targets():
    return [stage_output("failure_analyze", "timeline", drill=d) for d in DRILLS]


def pack_timeline_targets():
    """Each drill's picture, copied into the pack folder beside failure-test.md."""
    folder = Path(stage_output("failure_test", "markdown")).parent
    return [str(folder / f"failure-timeline-{d}.png") for d in DRILLS]


def tracked_targets(tracked):
    """The summaries of the jobs tracked as `tracked` (per point, its schedule's, measurement's
    and analysis's; per drill, its report)."""
    out = []
    for stage in stages_lib.TRACKED[tracked]:
        if "{drill}" in stage.folder:
            out += [stage.output(stage.summary, RESULTS, drill=d) for d in DRILLS]
        else:
            out += point_targets(stage.name, stage.summary)
    return out


def has_tracked_jobs(tracked):
    """Whether the jobs tracked as `tracked` exist in this pack (known before any job)."""
    if any("{drill}" in stage.folder for stage in stages_lib.TRACKED[tracked]):
        return bool(DRILLS)
    return bool(POINTS) or SEARCH is not None


# The MLflow runs of the pack's jobs (those it has), by track job name.
TRACKED_STAGES = [t for t in stages_lib.TRACKED if has_tracked_jobs(t)]


def tracked_record_modules(tracked):
    """The modules of the tracked stages' record functions: the track job runs them."""
    return sorted({stage.record_module for stage in stages_lib.TRACKED[tracked]})


def search_targets():
    """The summary of each cache state's search (it needs every round, so every point)."""
    if SEARCH is None:
        return []
    return [stage_output("search", "summary", cache=c) for c in PACK.sweep.cache_states]


def all_targets():
    """Every output of the pack but the autopsy. Known before any job: a searched point is an
    input of its cache state's search summary, so each cache state's rounds are discovered by a
    job of their own, cold and warm alongside."""
    return [
        FROZEN,
        *point_targets("schedule", "summary", POINTS),
        *point_targets("sweep", "summary", POINTS),
        *point_targets("normalize", "summary", POINTS),
        *point_targets("analyze", "report", POINTS),
        *search_targets(),
        *(stage_output("track", "runs", stage=stage) for stage in TRACKED_STAGES),
        stage_output("report", "readme"),
        *([stage_output("failure_test", "markdown")] if DRILLS else []),
        stage_output("dashboard", "dashboard"),
    ]


def publish_targets():
    """What the pack folder holds once it is finished: the pipeline's outputs, the autopsy and
    the HTML report (the last to be written)."""
    return [*all_targets(), AUTOPSY_MD, stage_output("html", "index")]


# The SLO-boundary search (rules/search.smk): its settings and the walk over its rounds.
SEARCH_INPUTS = search_lib.SearchInputs.of(PACK) if SEARCH is not None else None
SEARCH_INPUTS_JSON = SEARCH_INPUTS.canonical_json() if SEARCH is not None else ""
MAX_ROUNDS = SEARCH.max_rounds if SEARCH is not None else 0


def search_round_file(cache, k):
    """Round k's file of `cache`, once its checkpoint has run (else Snakemake schedules it)."""
    return checkpoints.search_round.get(cache=cache, round=k).output.round


def search_plans(cache, rounds=None):
    """The plans of `cache`'s rounds, walking round files 1, 2, ... until the search is done
    (or only the first `rounds` files: then the plans of rounds 1..rounds+1 at most)."""
    docs = []
    while True:
        plans = search_lib.plan_rounds(docs, SEARCH_INPUTS, MAX_ROUNDS, cache)
        if len(plans) == len(docs) or (rounds is not None and len(docs) == rounds):
            return plans
        docs.append(json.loads(Path(search_round_file(cache, len(docs) + 1)).read_text()))


def searched_points():
    """Every point of every round of both cache states' searches."""
    return [
        p for cache in PACK.sweep.cache_states
        for p in search_lib.searched_points(search_plans(cache))
    ]  # fmt: skip


def search_round_files(wildcards):
    """Every round file of `wildcards.cache`'s search, in round order."""
    return [
        stage_output("search_round", "round", cache=wildcards.cache, round=plan["round"])
        for plan in search_plans(wildcards.cache)
    ]


def search_round_reports(wildcards):
    """The reports round `wildcards.round` decides on: rounds 1..k's points, declared closed-loop
    points of the cache state."""
    k = int(wildcards.round)
    plans = search_plans(wildcards.cache, rounds=k - 1)
    if len(plans) < k:
        raise WorkflowError(
            f"search of the {wildcards.cache} cache state: it ended at round {len(plans)}, "
            f"there is no round {k}"
        )
    fixed = [p for p in POINTS if p.mode == "closed" and p.cache_state == wildcards.cache]
    return point_targets("analyze", "report", fixed + search_lib.searched_points(plans[:k]))


def earlier_round_files(wildcards):
    """Round files 1..k-1: a rerun of one reruns the rounds after it."""
    return [
        stage_output("search_round", "round", cache=wildcards.cache, round=j)
        for j in range(1, int(wildcards.round))
    ]
