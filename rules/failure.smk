rule dashboard:
    """Prometheus alert rules and a Grafana dashboard from the engine's metric names."""
    output:
        rules=f"{RESULTS}/pack/alerts/alert-rules.yaml",
        omitted=f"{RESULTS}/pack/alerts/omitted.json",
        dashboard=f"{RESULTS}/pack/dashboard/grafana-dashboard.json",
    params:
        # Engine name, workload cutoffs, gates and thresholds: the rules' only inputs.
        inputs=lambda w: DASHBOARD_INPUTS_JSON,
        code=code_hash("dashboard.py"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/dashboard.log",
    benchmark:
        f"{RESULTS}/benchmarks/dashboard.tsv"
    script:
        "../scripts/dashboard.py"


rule failure_drill:
    """Run one failure drill at the capacity point: inject, scrape, record every request."""
    input:
        capacity=f"{RESULTS}/capacity/capacity.json",
        reports=open_report_targets(),
    output:
        drill=f"{RESULTS}/failure/{{drill}}/drill.json",
        records=f"{RESULTS}/failure/{{drill}}/records.jsonl",
        samples=f"{RESULTS}/failure/{{drill}}/samples.parquet",
        scrapes=f"{RESULTS}/failure/{{drill}}/scrapes.parquet",
        events=f"{RESULTS}/failure/{{drill}}/events.json",
    params:
        # The drill's settings plus what any measurement reads (target, client, prompts).
        inputs=drill_inputs_json,
        code=code_hash("failure_drill.py", *SIM_ENGINE),
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
    """The failure-test fields of one drill; the pack's alert rules evaluated on its series."""
    input:
        drill=f"{RESULTS}/failure/{{drill}}/drill.json",
        records=f"{RESULTS}/failure/{{drill}}/records.jsonl",
        samples=f"{RESULTS}/failure/{{drill}}/samples.parquet",
        scrapes=f"{RESULTS}/failure/{{drill}}/scrapes.parquet",
        events=f"{RESULTS}/failure/{{drill}}/events.json",
        rules=f"{RESULTS}/pack/alerts/alert-rules.yaml",
    output:
        report=f"{RESULTS}/failure/{{drill}}/drill-report.json",
    params:
        # Gates, cutoffs and windows: a changed gate re-analyzes, it never re-runs a drill.
        spec=lambda w: DRILL_SPEC_JSON,
        code=code_hash("failure_analyze.py"),
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
    output:
        markdown=report(
            f"{RESULTS}/pack/failure-test.md",
            category="Failure test",
            caption="../report/failure-test.rst",
        ),
        json=f"{RESULTS}/pack/failure-test.json",
    params:
        pack=lambda w: PACK_INFO_JSON,
        code=code_hash("failure_test.py"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/failure-test.log",
    benchmark:
        f"{RESULTS}/benchmarks/failure-test.tsv"
    script:
        "../scripts/failure_test.py"
