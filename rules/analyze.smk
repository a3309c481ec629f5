rule analyze:
    """Per-class SLO report of one point: the acceptance gates plus CIs, trend, Little's Law."""
    priority: CHAIN_PRIORITY
    input:
        requests=stage_output("normalize", "requests"),
        chunks=stage_output("normalize", "chunks"),
        metrics=stage_output("normalize", "metrics"),
        sweep=stage_output("sweep", "summary"),
    output:
        **stage_outputs("analyze"),
    params:
        point=lambda w: w.point,
        cache_state=lambda w: w.cache,
        repeat=lambda w: int(w.repeat),
        # Cutoffs, fixed lengths and gates: a changed gate re-analyzes, it does not re-measure.
        spec=lambda w: ANALYSIS_SPEC_JSON,
        # A simulated target's engine model, as the attainment's control variate.
        control=control_inputs_json,
        code=stage_code_hash("analyze"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/analyze/{{point}}/{{cache}}/rep{{repeat}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analyze/{{point}}/{{cache}}/rep{{repeat}}.tsv"
    script:
        "../scripts/analyze.py"
