rule track:
    """MLflow child run per job of a stage, under the parent run of the current frozen manifest."""
    input:
        frozen=FROZEN,
        summaries=lambda w: TRACKED_STAGES[w.stage](),
    output:
        f"{RESULTS}/tracking/{{stage}}.json",
    params:
        stage=lambda w: w.stage,
        results_root=results_root,
        code=lambda w: code_hash("track.py", tracking_lib.STAGE_MODULES[w.stage]),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/track/{{stage}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/track/{{stage}}.tsv"
    script:
        "../scripts/track.py"
