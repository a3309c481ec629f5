rule analyze:
    """Per-class SLO report of one point: the acceptance gates plus CIs, trend, Little's Law."""
    input:
        requests=f"{RESULTS}/tables/{{point}}/{{cache}}/rep{{repeat}}/requests.parquet",
        chunks=f"{RESULTS}/tables/{{point}}/{{cache}}/rep{{repeat}}/chunks.parquet",
        metrics=f"{RESULTS}/tables/{{point}}/{{cache}}/rep{{repeat}}/server_metrics.parquet",
        sweep=f"{RESULTS}/raw/{{point}}/{{cache}}/rep{{repeat}}/summary.json",
    output:
        report=f"{RESULTS}/reports/{{point}}/{{cache}}/rep{{repeat}}/slo-report.json",
    params:
        point=lambda w: w.point,
        cache_state=lambda w: w.cache,
        repeat=lambda w: int(w.repeat),
        # Cutoffs, fixed lengths and gates: a changed gate re-analyzes, it does not re-measure.
        spec=lambda w: ANALYSIS_SPEC_JSON,
        code=code_hash("analyze.py"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/analyze/{{point}}/{{cache}}/rep{{repeat}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/analyze/{{point}}/{{cache}}/rep{{repeat}}.tsv"
    script:
        "../scripts/analyze.py"
