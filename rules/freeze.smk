rule freeze:
    """Lint the pack, refuse mutable revisions, write the frozen manifest, open the MLflow parent run."""
    output:
        frozen=FROZEN,
        fit=f"{RESULTS}/manifest/fit-probe.json",
    params:
        manifest=lambda w: MANIFEST_JSON,
        source=CONFIG_SOURCE,
        results_root=results_root,
        code=code_hash("freeze.py"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/freeze.log",
    benchmark:
        f"{RESULTS}/benchmarks/freeze.tsv"
    script:
        "../scripts/freeze.py"
