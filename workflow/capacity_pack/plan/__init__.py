"""What a pack is and what it will send: the pack schema and frozen manifest, seeded schedules,
prompts, token counting and the benchmark lint.
"""
