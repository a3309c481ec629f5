rule track_schedules:
    """MLflow child run per schedule job, under the parent run of the current frozen manifest."""
    input:
        frozen=FROZEN,
        summaries=schedule_targets(),
    output:
        f"{RESULTS}/tracking/schedule.json",
    params:
        results_root=results_root,
        code=code_hash("tracking"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/track/schedule.log",
    benchmark:
        f"{RESULTS}/benchmarks/track/schedule.tsv"
    script:
        "../scripts/track_schedules.py"
