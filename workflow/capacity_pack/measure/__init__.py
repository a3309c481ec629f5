"""Measuring a target: the load generator, one point's measurement (sweep), sharded client
processes, and the targets a pack measures (simulated, managed, external).
"""
