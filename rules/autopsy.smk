rule autopsy:
    """Where the run's wall clock and each SLO miss went: timeline, critical path, buckets."""
    input:
        # Last of all: every other output of the pack, so the autopsy sees the whole run.
        done=all_targets(),
        requests=lambda w: point_targets("normalize", "requests"),
    output:
        # In `snakemake --report` through pack/index.html (rules/html.smk), which holds it.
        markdown=AUTOPSY_MD,
        json=stage_output("autopsy", "json"),
    params:
        pack=lambda w: MANIFEST_JSON,
        results_dir=lambda w, output: str(Path(output.json).parents[1]),
        # Provenance the run itself wrote: Snakemake's own logs and the git history.
        log_dir=".snakemake/log",
        repo_dir=workflow.basedir,
        code=stage_code_hash("autopsy"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/autopsy.log",
    benchmark:
        f"{RESULTS}/benchmarks/autopsy.tsv"
    script:
        "../scripts/autopsy.py"
