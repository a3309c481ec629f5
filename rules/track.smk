rule track:
    """MLflow runs under the parent run of the current frozen manifest: one per measured point
    (its schedule, measurement and analysis), one per drill."""
    input:
        frozen=FROZEN,
        summaries=lambda w: tracked_targets(w.stage),
    output:
        **stage_outputs("track"),
    wildcard_constraints:
        # Only the tracked jobs' names: tracking/parent.json is publish's.
        stage="|".join(TRACKED_STAGES),
    params:
        stage=lambda w: w.stage,
        results_root=results_root,
        code=lambda w: stage_code_hash("track", *tracked_record_modules(w.stage)),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/track/{{stage}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/track/{{stage}}.tsv"
    script:
        "../scripts/track.py"


rule publish:
    """The finished pack on the MLflow parent run (decision, metrics, every file): last of all."""
    input:
        frozen=FROZEN,
        capacity=stage_output("capacity", "capacity"),
        plan=stage_output("capacity", "plan"),
        readme=stage_output("report", "readme"),
        # Every other file of the pack folder: the failure test, the autopsy, the HTML report.
        done=publish_targets(),
    output:
        **stage_outputs("publish"),
    params:
        results_root=results_root,
        code=stage_code_hash("publish"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/publish.log",
    benchmark:
        f"{RESULTS}/benchmarks/publish.tsv"
    script:
        "../scripts/publish.py"
