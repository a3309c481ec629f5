# The SLO-boundary search (sweep.search; capacity_pack.decide.search), one cache state at a time.
#
# Round k of a cache state is the checkpoint job search_round(cache, round=k): it reads the SLO
# reports of every point of rounds 1..k (and the declared closed-loop points) and writes
# search/<cache>/round<k>.json, which says what round k+1 may measure. Round k's points come
# from round files 1..k-1 (checkpoints.search_round.get(...) for each, which is how Snakemake
# discovers the next round) and max_rounds (capacity_pack.decide.search.plan_rounds). Every
# point is an ordinary schedule/sweep/normalize/analyze job (open-r35/cold/rep0), so a rerun
# measures only new points; a changed gate re-analyzes the points, which reruns the rounds
# (their reports are newer) before any new point is measured. The round rule's params hold
# what a decision reads (search settings, repeats, the closed-loop attainment gate), never
# max_rounds: raising it leaves every round file as it is and only adds rounds.
checkpoint search_round:
    """One round of a cache state's SLO-boundary search: the bracket so far, the next round."""
    priority: CHAIN_PRIORITY
    input:
        reports=search_round_reports,
        rounds=earlier_round_files,
        # initial: predicted starts from the preflight prediction's bracket (rules/preflight.smk).
        preflight=PREFLIGHT_TARGETS[0] if SEARCH_INPUTS and SEARCH_INPUTS.predicted else [],
    output:
        **stage_outputs("search_round"),
    params:
        # Search settings but max_rounds, repeats and the closed-loop gate; the open-loop
        # verdicts come from the reports, whose gates the analyze rule's params hold.
        inputs=lambda w: SEARCH_INPUTS_JSON,
        code=stage_code_hash("search_round"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/search/{{cache}}/round{{round}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/search/{{cache}}/round{{round}}.tsv"
    script:
        "../scripts/search_round.py"


rule search:
    """A cache state's finished search: each round's points and kind, why it stopped, the bracket."""
    priority: CHAIN_PRIORITY
    input:
        # The last round's file needs every point's report: requesting the rounds measures all.
        rounds=search_round_files,
    output:
        **stage_outputs("search"),
    params:
        inputs=lambda w: SEARCH_INPUTS_JSON,
        max_rounds=MAX_ROUNDS,
        code=stage_code_hash("search"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/search/{{cache}}/search.log",
    benchmark:
        f"{RESULTS}/benchmarks/search/{{cache}}/search.tsv"
    script:
        "../scripts/search.py"
