"""From raw records to evidence: validated request tables, normalization, per-point SLO analysis,
and imports of other clients' exports.
"""
