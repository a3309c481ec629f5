# A checkpoint: the drills read its numbers as params once it has run (rules/failure.smk), so
# that a rerun decision that lands where it was re-measures no drill.
checkpoint capacity:
    """Capacity per cache state across repeats, the closed-loop operating point, the plan."""
    priority: CHAIN_PRIORITY
    input:
        # Functions: with sweep.search, the searched points are known only round by round.
        reports=lambda w: report_targets(),
        # The plan sizes KV from the contexts sent at the capacity point (their tables).
        tables=lambda w: point_targets("normalize", "requests"),
        search=search_targets(),
    output:
        **stage_outputs("capacity"),
    params:
        # Everything the decision reads: workload, gates, placement, plan, target profile.
        pack=lambda w: CAPACITY_INPUTS_JSON,
        code=stage_code_hash("capacity"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/capacity.log",
    benchmark:
        f"{RESULTS}/benchmarks/capacity.tsv"
    script:
        "../scripts/capacity.py"


rule report:
    """The pack a person reads: README, plots, manifest, requests and SLO report."""
    input:
        **stage_outputs("freeze"),
        **stage_outputs("capacity"),
        reports=lambda w: report_targets(),
        tables=lambda w: point_targets("normalize", "csv"),
        metrics=lambda w: point_targets("normalize", "metrics"),
        # The failure answer belongs next to the decision: the README waits for the drills.
        failure=[stage_output("failure_test", "json")] if DRILLS else [],
        # Each load shape's answer and plot (pack/shapes.json, shape-<name>.png).
        shapes=shapes_targets(),
        # The twin's predicted vs measured capacity, when the pack calibrates one.
        twin=TWIN_TARGETS,
    output:
        # In `snakemake --report` through pack/index.html (rules/html.smk), which holds it.
        readme=stage_output("report", "readme"),
        plots=[
            report(
                f"{Path(stage_output('report', 'readme')).parent}/{name}",
                category="Plots",
                caption=f"../report/{name[:-4]}.rst",
            )
            for name in PACK_PLOTS
        ],
    params:
        code=stage_code_hash("report"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/report.log",
    benchmark:
        f"{RESULTS}/benchmarks/report.tsv"
    script:
        "../scripts/report.py"
