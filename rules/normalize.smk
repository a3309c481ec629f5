rule normalize:
    """Validate and reconcile one point's records into requests/chunks/metrics tables."""
    input:
        records=f"{RESULTS}/raw/{{point}}/{{cache}}/rep{{repeat}}/records.jsonl",
        metrics=f"{RESULTS}/raw/{{point}}/{{cache}}/rep{{repeat}}/metrics.parquet",
        summary=f"{RESULTS}/raw/{{point}}/{{cache}}/rep{{repeat}}/summary.json",
        schedule=f"{RESULTS}/schedules/{{point}}/{{cache}}/rep{{repeat}}/schedule.parquet",
    output:
        requests=f"{RESULTS}/tables/{{point}}/{{cache}}/rep{{repeat}}/requests.parquet",
        chunks=f"{RESULTS}/tables/{{point}}/{{cache}}/rep{{repeat}}/chunks.parquet",
        metrics=f"{RESULTS}/tables/{{point}}/{{cache}}/rep{{repeat}}/server_metrics.parquet",
        csv=f"{RESULTS}/tables/{{point}}/{{cache}}/rep{{repeat}}/requests.csv",
        summary=f"{RESULTS}/tables/{{point}}/{{cache}}/rep{{repeat}}/summary.json",
    params:
        point=lambda w: w.point,
        cache_state=lambda w: w.cache,
        repeat=lambda w: int(w.repeat),
        inputs=schedule_inputs_json,
        code=code_hash("normalize.py"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/normalize/{{point}}/{{cache}}/rep{{repeat}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/normalize/{{point}}/{{cache}}/rep{{repeat}}.tsv"
    script:
        "../scripts/normalize.py"
