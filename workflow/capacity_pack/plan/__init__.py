"""What a pack is and what it will send: the pack schema and frozen manifest (with the bounds of
its values and strict YAML reading), seeded schedules, prompts, token counting and the benchmark
lint.
"""
