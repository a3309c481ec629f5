"""Performance autopsy of a pack run (capacity_pack.autopsy.run) and of its SLO misses
(capacity_pack.autopsy.requests).

The run autopsy is split by role: ``sources`` (Snakemake logs, benchmark TSVs, records, MLflow,
git), ``timeline`` (job times, dependencies, critical path), ``clocks`` (load windows, clock
cross-check), ``buckets`` (cost buckets, counterfactuals, finding or waste), ``checks``
(disagreements between sources, missing evidence), ``run`` (the document) and ``markdown``.

``autopsy_markdown`` puts the two together as ``pack/autopsy.md``: where the run's wall clock
went (timeline from several sources, critical path, cost buckets, clock cross-check,
counterfactuals, finding or waste, missing evidence), then, per measured point, which cause
explains each SLO miss.
"""

from __future__ import annotations

from typing import Any


def autopsy_markdown(doc: dict[str, Any], pack: Any) -> str:
    """``autopsy.md`` from the autopsy document (``{"run": ..., "requests": ...}``)."""
    from capacity_pack.autopsy.markdown import run_autopsy_markdown
    from capacity_pack.autopsy.requests import request_autopsy_markdown

    head = [
        f"# Performance autopsy: {pack.pack.title or pack.pack.name}",
        "",
        f"> {pack.pack.label}",
        "",
        "Every figure is labelled by how it is known: measured (a source recorded it), derived "
        "(arithmetic on measured figures) or estimated. Sources that disagree are reported as "
        "results, not reconciled silently.",
        "",
    ]
    if "unavailable" in doc["run"]:
        body = f"## The run\n\nNot autopsied: {doc['run']['unavailable']}."
    else:
        body = run_autopsy_markdown(doc["run"]).rstrip()
    if body.startswith("# "):
        body = body.split("\n", 1)[1].lstrip("\n")  # one title for the whole file
    requests = request_autopsy_markdown(doc["requests"]).rstrip()
    return "\n".join(head) + "\n" + body + "\n\n" + requests + "\n"
