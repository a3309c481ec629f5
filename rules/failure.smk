rule dashboard:
    """Prometheus alert rules and a Grafana dashboard from the engine's metric names."""
    output:
        **stage_outputs("dashboard"),
    params:
        # Engine name, workload cutoffs, gates and thresholds: the rules' only inputs.
        inputs=lambda w: DASHBOARD_INPUTS_JSON,
        code=stage_code_hash("dashboard"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/dashboard.log",
    benchmark:
        f"{RESULTS}/benchmarks/dashboard.tsv"
    script:
        "../scripts/dashboard.py"


rule failure_drill:
    """Run one failure drill (at the capacity point, or the plan drill on the recommended fleet
    at its peak): inject, scrape, record every request."""
    priority: CHAIN_PRIORITY
    input:
        unpack(plan_drill_twin),
        # No file of the decision: it waits for the capacity checkpoint and takes its numbers.
        decided=capacity_decided,
    output:
        **stage_outputs("failure_drill"),
    params:
        # The drill's settings plus what any measurement reads (target, client, prompts).
        inputs=drill_inputs_json,
        # The decision's numbers: the rate, the in-flight basis of admission, the plan.
        numbers=drill_numbers_json,
        code=stage_code_hash("failure_drill", *SIM_ENGINE),
    # Alone on the host when the target is local (measure_threads).
    threads: lambda w: measure_threads()
    resources:
        # One measurement at a time against one target, whatever --cores or --jobs say.
        **{TARGET_RESOURCE: 1},
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/failure/{{drill}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/failure/{{drill}}.tsv"
    script:
        "../scripts/failure_drill.py"


rule failure_analyze:
    """The failure-test fields of one drill; the pack's alert rules evaluated on its series; its
    timeline picture."""
    input:
        **stage_outputs("failure_drill"),
        rules=stage_output("dashboard", "rules"),
    output:
        **stage_outputs("failure_analyze"),
    params:
        # Gates, cutoffs and windows: a changed gate re-analyzes, it never re-runs a drill.
        spec=lambda w: DRILL_SPEC_JSON,
        code=stage_code_hash("failure_analyze"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/failure/{{drill}}.analyze.log",
    benchmark:
        f"{RESULTS}/benchmarks/failure/{{drill}}.analyze.tsv"
    script:
        "../scripts/failure_analyze.py"


rule failure_test:
    """failure-test.md and failure-test.json: every drill's fields side by side."""
    input:
        reports=drill_report_targets(),
        timelines=drill_timeline_targets(),
    output:
        # In `snakemake --report` through pack/index.html (rules/html.smk), which holds it.
        markdown=stage_output("failure_test", "markdown"),
        json=stage_output("failure_test", "json"),
        timelines=[
            report(p, category="Failure test", caption="../report/failure-timeline.rst")
            for p in pack_timeline_targets()
        ],
    params:
        pack=lambda w: PACK_INFO_JSON,
        code=stage_code_hash("failure_test"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/failure-test.log",
    benchmark:
        f"{RESULTS}/benchmarks/failure-test.tsv"
    script:
        "../scripts/failure_test.py"
