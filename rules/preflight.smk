# The preflight prediction (capacity_pack.twin.preflight): a simulated target's planned points
# and capacity bracket in virtual time, written before the sweeps measure them. Its params are
# the pack less what no prediction reads (its title and description, the failure drills), so a
# reworded pack or a changed drill does not predict again.
PREFLIGHT_INPUTS_JSON = canonical_json(
    {
        **PACK.model_dump(mode="json", exclude={"failure"}),
        "pack": {**PACK.pack.model_dump(mode="json"), "title": "", "description": ""},
    }
)
# Only a simulated target has an engine model of its own to predict on before measuring.
PREFLIGHT_TARGETS = [stage_output("preflight", "preflight")] if PACK.target.kind == "sim" else []


rule preflight:
    """The planned open-loop points' verdicts and the capacity bracket, predicted in virtual time."""
    # Before the sweeps: its prediction is read before the hours of measurement it predicts.
    priority: CHAIN_PRIORITY + 1
    output:
        **stage_outputs("preflight"),
    params:
        pack=lambda w: PREFLIGHT_INPUTS_JSON,
        code=stage_code_hash("preflight"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/preflight.log",
    benchmark:
        f"{RESULTS}/benchmarks/preflight.tsv"
    script:
        "../scripts/preflight.py"
