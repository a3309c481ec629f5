rule sweep:
    """Measure one point against the target; every attempted request is recorded."""
    priority: CHAIN_PRIORITY
    input:
        schedule=stage_output("schedule", "schedule"),
        prompts=stage_output("prompts", "prompts"),
    output:
        **stage_outputs("sweep"),
    params:
        point=lambda w: w.point,
        cache_state=lambda w: w.cache,
        repeat=lambda w: int(w.repeat),
        # Exactly what a measurement reads: target, model, client, request, prompts, sample gate.
        inputs=sweep_inputs_json,
        # Whether the in-run gate comes from the config (searching packs): see gate_from_config.
        gate_from_config=gate_from_config,
        code=stage_code_hash("sweep", *SIM_ENGINE),
    # A sharded point runs one client process per shard (capacity_pack.measure.shards).
    threads: sweep_threads
    resources:
        # One measurement at a time against one target, whatever --cores or --jobs say.
        **{TARGET_RESOURCE: 1},
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/sweep/{{point}}/{{cache}}/rep{{repeat}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/sweep/{{point}}/{{cache}}/rep{{repeat}}.tsv"
    script:
        "../scripts/sweep.py"
