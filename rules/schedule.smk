rule schedule:
    """Seeded arrival schedule of one point (rate or concurrency x cache state x repeat)."""
    priority: CHAIN_PRIORITY
    output:
        **stage_outputs("schedule"),
    params:
        point=lambda w: w.point,
        cache_state=lambda w: w.cache,
        repeat=lambda w: int(w.repeat),
        # Exactly what this point's schedule reads; a change here (and only here) reruns it.
        inputs=schedule_inputs_json,
        code=stage_code_hash("schedule"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/schedule/{{point}}/{{cache}}/rep{{repeat}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/schedule/{{point}}/{{cache}}/rep{{repeat}}.tsv"
    script:
        "../scripts/schedule.py"
