rule freeze:
    """Lint the pack, refuse mutable revisions, write the frozen manifest, open the MLflow parent run."""
    output:
        **stage_outputs("freeze"),
    params:
        manifest=lambda w: MANIFEST_JSON,
        source=CONFIG_SOURCE,
        results_root=results_root,
        code=stage_code_hash("freeze"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/freeze.log",
    benchmark:
        f"{RESULTS}/benchmarks/freeze.tsv"
    script:
        "../scripts/freeze.py"
