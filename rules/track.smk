rule track:
    """MLflow child run per job of a stage, under the parent run of the current frozen manifest."""
    input:
        frozen=FROZEN,
        summaries=lambda w: tracked_targets(w.stage),
    output:
        **stage_outputs("track"),
    params:
        stage=lambda w: w.stage,
        results_root=results_root,
        code=lambda w: stage_code_hash("track", tracked_record_module(w.stage)),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/track/{{stage}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/track/{{stage}}.tsv"
    script:
        "../scripts/track.py"
