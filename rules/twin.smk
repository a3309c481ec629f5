# The calibrated twin: the target's engine model fitted to the declared closed-loop points of the
# cold cache state (capacity_pack.twin.calibrate). Planned only when the pack can be calibrated
# (concurrency 1 and another level, cold, a model shape): CALIBRATE_INPUTS is None otherwise.
from capacity_pack.twin import calibrate as calibrate_lib

try:
    CALIBRATE_INPUTS = calibrate_lib.CalibrationInputs.of(PACK)
except ValueError as err:
    raise WorkflowError(f"{CONFIG_SOURCE}: {err}") from None
CALIBRATE_INPUTS_JSON = CALIBRATE_INPUTS.canonical_json() if CALIBRATE_INPUTS else ""


# The requests tables of the calibration points, in the inputs' order; the calibration's outputs
# when the pack has a calibrate job (none otherwise).
CALIBRATE_TABLES = [
    stage_output("normalize", "requests", point=p.point, cache=p.cache_state, repeat=p.repeat)
    for p in (CALIBRATE_INPUTS.points if CALIBRATE_INPUTS else [])
]
CALIBRATE_TARGETS = list(stage_outputs("calibrate").values()) if CALIBRATE_INPUTS else []


rule calibrate:
    """The target's engine model fitted to the pack's closed loop (never the open loop)."""
    input:
        tables=CALIBRATE_TABLES,
    output:
        **stage_outputs("calibrate"),
    params:
        # The base profile (shape, peaks, limits) and the points fitted.
        inputs=lambda w: CALIBRATE_INPUTS_JSON,
        code=stage_code_hash("calibrate"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/calibrate.log",
    benchmark:
        f"{RESULTS}/benchmarks/calibrate.tsv"
    script:
        "../scripts/calibrate.py"


# Prediction, then validation (capacity_pack.twin.validate): the calibrated twin predicts each
# cache state's open-loop capacity from the calibration and the manifest alone (no open-loop
# file is among twin_predict's inputs), then twin_validate compares it with capacity.json.
TWIN_TARGETS = (
    [stage_output("twin_validate", "validation")]
    if CALIBRATE_INPUTS and PACK.sweep.has_open_loop
    else []
)


rule twin_predict:
    """The calibrated twin's open-loop capacity, predicted before the open loop is read."""
    input:
        **stage_outputs("calibrate"),
    output:
        **stage_outputs("twin_predict"),
    params:
        pack=lambda w: PREFLIGHT_INPUTS_JSON,
        code=stage_code_hash("twin_predict"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/twin_predict.log",
    benchmark:
        f"{RESULTS}/benchmarks/twin_predict.tsv"
    script:
        "../scripts/twin_predict.py"


rule twin_validate:
    """The twin's predicted capacity against the measured one; trusted within the tolerance."""
    input:
        profile=stage_output("calibrate", "profile"),
        **stage_outputs("twin_predict"),
        capacity=stage_output("capacity", "capacity"),
    output:
        **stage_outputs("twin_validate"),
    params:
        pack=lambda w: PREFLIGHT_INPUTS_JSON,
        code=stage_code_hash("twin_validate"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/twin_validate.log",
    benchmark:
        f"{RESULTS}/benchmarks/twin_validate.tsv"
    script:
        "../scripts/twin_validate.py"
