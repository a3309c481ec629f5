rule normalize:
    """Validate and reconcile one point's records into requests/chunks/metrics tables."""
    priority: CHAIN_PRIORITY
    input:
        **stage_outputs("sweep"),
        schedule=stage_output("schedule", "schedule"),
    output:
        **stage_outputs("normalize"),
    params:
        point=lambda w: w.point,
        cache_state=lambda w: w.cache,
        repeat=lambda w: int(w.repeat),
        inputs=schedule_inputs_json,
        code=stage_code_hash("normalize"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/normalize/{{point}}/{{cache}}/rep{{repeat}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/normalize/{{point}}/{{cache}}/rep{{repeat}}.tsv"
    script:
        "../scripts/normalize.py"
