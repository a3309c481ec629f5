"""Failure drills and what watches them: the drill pipeline, alert rules, the Grafana dashboard and
the PromQL evaluator.
"""
