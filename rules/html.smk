rule html:
    """The pack as one page, pack/index.html: decision first, plots embedded, nothing fetched."""
    input:
        # The pack's own files: the README with its plots and copies, the failure test, the
        # autopsy (last of the pack's jobs, so the page holds it), and every point's report.
        readme=stage_output("report", "readme"),
        failure=(
            [stage_output("failure_test", "markdown"), stage_output("failure_test", "json")]
            if DRILLS
            else []
        ),
        autopsy=[stage_output("autopsy", "markdown"), stage_output("autopsy", "json")],
        reports=lambda w: report_targets(),
    output:
        index=report(
            stage_output("html", "index"), category="Decision", caption="../report/index.rst"
        ),
    params:
        code=stage_code_hash("html"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/html.log",
    benchmark:
        f"{RESULTS}/benchmarks/html.tsv"
    script:
        "../scripts/html.py"
