rule shapes:
    """Each load-shape experiment's own answer (smoke, average-load, stress, spike, soak,
    breakpoint) and its plot, from the experiment points' requests, series and reports."""
    input:
        requests=lambda w: point_targets("normalize", "requests", EXP_POINTS),
        metrics=lambda w: point_targets("normalize", "metrics", EXP_POINTS),
        reports=lambda w: point_targets("analyze", "report", EXP_POINTS),
    output:
        **stage_outputs("shapes"),
        # In `snakemake --report` through pack/index.html, and on their own.
        plots=[
            report(p, category="Load shapes", caption="../report/shape.rst")
            for p in shape_plot_targets()
        ],
    params:
        # Experiments, cutoffs and the two gates the answers read.
        inputs=lambda w: SHAPES_INPUTS_JSON,
        code=stage_code_hash("shapes"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/shapes.log",
    benchmark:
        f"{RESULTS}/benchmarks/shapes.tsv"
    script:
        "../scripts/shapes.py"
