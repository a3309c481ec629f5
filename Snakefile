# capacity-pack: an inference capacity pack for an OpenAI-compatible serving endpoint.
#
#   snakemake --cores 2                                    # the default pack (config/config.yaml)
#   snakemake --cores 2 --configfile config/packs/X.yaml   # another pack, replacing the default
#
# The config is validated by the pydantic schema in capacity_pack.plan.manifest before any job runs.
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

min_version("9.27")

# The library also works from a plain checkout (no pip install -e .).
sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from capacity_pack.engines import check_cache_reset
from capacity_pack.measure import lifeline
from capacity_pack.measure.lock import LockSettings, without_lock_settings
from capacity_pack.plan.lint import lint_pack
from capacity_pack.plan.manifest import ManifestError, validate_pack

# A --configfile replaces the default pack instead of being merged into it: a merge would
# silently keep the default's experiments or target in another pack.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


CONFIG_SOURCE = ", ".join(map(str, workflow.overwrite_configfiles or ["config/config.yaml"]))
# The target lock's settings (`--config target_lock_wait=false target_lock_timeout_seconds=600`)
# are this invocation's, not the pack's: checked here, read by the measurement jobs from the
# config, never validated as pack fields nor hashed into a rule (capacity_pack.measure.lock).
try:
    LockSettings.from_config(config)
except ValueError as err:
    raise WorkflowError(f"--config: {err}") from None
try:
    PACK = validate_pack(without_lock_settings(config), CONFIG_SOURCE)
except ManifestError as err:
    raise WorkflowError(str(err)) from None
# A measurement job stops when this process is gone, even SIGKILLed: Snakemake gives its jobs no
# parent-death signal, so the job watches this process (capacity_pack.measure.lifeline).
os.environ[lifeline.INVOKER_ENV] = lifeline.invoker_token()
# The cache-reset names are the registered engines'.
if PROBLEM := check_cache_reset(PACK.target):
    raise WorkflowError(f"{CONFIG_SOURCE}: invalid pack configuration: {PROBLEM}")
# Benchmark anti-patterns stop the pipeline before any job runs (the freeze rule checks again).
if FINDINGS := lint_pack(PACK):
    raise WorkflowError(
        f"{CONFIG_SOURCE}: benchmark anti-patterns found; fix the pack:\n"
        + "\n".join(f"  - {f.code}: {f.message} (why: {f.reason})" for f in FINDINGS)
    )

# The fit probe: a pack whose longest request cannot fit its accelerator stops here too.
from capacity_pack.decide.capacity import preflight_fit

FIT = preflight_fit(PACK)
if FIT["checked"] and FIT["verdict"] == "does-not-fit":
    raise WorkflowError(
        f"{CONFIG_SOURCE}: fit probe: does-not-fit: a {FIT['context_tokens']}-token request "
        f"needs {FIT['need_gb']:.2f} GB of {FIT['budget_gb']:.2f} GB"
        + (f" ({FIT['reason']})" if FIT.get("reason") else "")
    )


include: "rules/common.smk"


# Measurement jobs take one unit of the target's resource (TARGET_RESOURCE, `target_<slug>`,
# capacity_pack.measure.cluster), so no two ever load one target at once, under any executor and
# whatever --cores or --jobs say. `--resources` given by hand wins (setdefault).
workflow.global_resources.setdefault(TARGET_RESOURCE, 1)


include: "rules/freeze.smk"
include: "rules/schedule.smk"
include: "rules/prompts.smk"
include: "rules/preflight.smk"
include: "rules/sweep.smk"
include: "rules/normalize.smk"
include: "rules/analyze.smk"
include: "rules/search.smk"
include: "rules/twin.smk"
include: "rules/capacity.smk"
include: "rules/shapes.smk"
include: "rules/failure.smk"
include: "rules/track.smk"
include: "rules/autopsy.smk"
include: "rules/html.smk"
include: "rules/progress.smk"


rule all:
    default_target: True
    input:
        all_targets(),
        # The calibrated twin (rules/twin.smk): none when the pack cannot be calibrated.
        CALIBRATE_TARGETS,
        PREFLIGHT_TARGETS,
        AUTOPSY_MD,
        # After the autopsy (it reads the autopsy): not in all_targets(), which the autopsy waits on.
        stage_output("html", "index"),
        stage_output("publish", "published"),


# The whole pack's progress: the measurement points planned and the load ahead, then a line as
# each measurement finishes (rules/progress.smk).
onstart:
    start_pack_progress()


# The run ends on its answer: the decision, the plan, the failure verdict and the pack's path
# (read from the pack's own files; nothing when this invocation built no pack yet).
onsuccess:
    from capacity_pack.decide.console import console_lines

    for line in console_lines(Path(RESULTS) / "pack"):
        print(line)
