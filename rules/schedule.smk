rule schedule:
    """Seeded arrival schedule of one point (rate or concurrency x cache state x repeat)."""
    input:
        frozen=ancient(FROZEN),
    output:
        schedule=f"{RESULTS}/schedules/{{point}}/{{cache}}/rep{{repeat}}/schedule.parquet",
        summary=f"{RESULTS}/schedules/{{point}}/{{cache}}/rep{{repeat}}/summary.json",
    params:
        point=lambda w: w.point,
        cache_state=lambda w: w.cache,
        repeat=lambda w: int(w.repeat),
        results_root=RESULTS_ROOT,
        sections=sections_hash(*schedule_lib.SCHEDULE_SECTIONS),
        point_spec=point_spec_hash,
        code=code_hash("schedule", "tables"),
    log:
        f"{RESULTS}/logs/schedule/{{point}}/{{cache}}/rep{{repeat}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/schedule/{{point}}/{{cache}}/rep{{repeat}}.tsv"
    script:
        "../scripts/schedule.py"
