rule prompts:
    """Every scheduled request's exact prompt, prepared before the target is reserved."""
    priority: CHAIN_PRIORITY
    input:
        schedule=stage_output("schedule", "schedule"),
    output:
        **stage_outputs("prompts"),
    params:
        # Corpus, prefix set, cold head, block length and the tokenizer file's sha256.
        inputs=lambda w: PROMPT_INPUTS_JSON,
        code=stage_code_hash("prompts"),
    conda:
        "../workflow/envs/capacity-pack.yaml"
    log:
        f"{RESULTS}/logs/prompts/{{point}}/{{cache}}/rep{{repeat}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/prompts/{{point}}/{{cache}}/rep{{repeat}}.tsv"
    script:
        "../scripts/prompts.py"
