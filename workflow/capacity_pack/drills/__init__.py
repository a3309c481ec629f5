"""Failure drills and what watches them: a drill planned (``plan``), run against its target
(``run``), analysed (``analyze``) and rendered (``render``); the Prometheus alert rules
(``alerts``) and the Grafana dashboard (``dashboard``), over the metric-map lookup and PromQL
builders they share (``queries``); the PromQL evaluator (``promql``).
"""
