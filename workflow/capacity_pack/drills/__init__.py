"""Failure drills and what watches them: the drill kinds, one module each in a registry
(``kinds``); a drill planned (``plan``), run against its target (``run``), analysed
(``analyze``) and rendered (``render``); the Prometheus alert rules (``alerts``) and the
Grafana dashboard (``dashboard``), over the metric-map lookup and PromQL builders they share
(``queries``); the alert rules run over a drill's series by Prometheus' own rule engine,
``promtool test rules`` (``prometheus``).
"""
