"""Failure drills and what watches them: a drill planned (``plan``), run against its target
(``run``), analysed (``analyze``) and rendered (``render``); alert rules and the Grafana dashboard
(``dashboard``); the PromQL evaluator (``promql``).
"""
