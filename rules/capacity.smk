rule capacity:
    """Capacity per cache state across repeats, the closed-loop operating point, the plan."""
    input:
        reports=report_targets(),
    output:
        capacity=f"{RESULTS}/capacity/capacity.json",
        plan=f"{RESULTS}/capacity/plan.json",
    params:
        # Everything the decision reads: workload, gates, placement, plan, target profile.
        pack=lambda w: CAPACITY_INPUTS_JSON,
        code=code_hash("capacity.py"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/capacity.log",
    benchmark:
        f"{RESULTS}/benchmarks/capacity.tsv"
    script:
        "../scripts/capacity.py"


rule report:
    """The pack a person reads: README, plots, manifest, requests and SLO report; MLflow run."""
    input:
        frozen=FROZEN,
        fit=f"{RESULTS}/manifest/fit-probe.json",
        capacity=f"{RESULTS}/capacity/capacity.json",
        plan=f"{RESULTS}/capacity/plan.json",
        reports=report_targets(),
        tables=[f"{point_dir('tables', p)}/requests.csv" for p in POINTS],
        metrics=[f"{point_dir('tables', p)}/server_metrics.parquet" for p in POINTS],
    output:
        readme=report(f"{RESULTS}/pack/README.md", category="Decision", caption="../report/readme.rst"),
        plots=[
            report(f"{RESULTS}/pack/{name}", category="Plots", caption=f"../report/{name[:-4]}.rst")
            for name in PACK_PLOTS
        ],
    params:
        results_root=results_root,
        code=code_hash("report.py"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/report.log",
    benchmark:
        f"{RESULTS}/benchmarks/report.tsv"
    script:
        "../scripts/report.py"
