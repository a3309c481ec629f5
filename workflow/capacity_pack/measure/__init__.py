"""Measuring a target: one point's measurement (sweep), the load generator, sharded client
processes, and the targets a pack measures (simulated, managed, external).

The load generator, by role: ``settings`` (what a run needs), ``payload`` (the requests),
``run`` (open and closed loops, the summary), ``arrivals`` (the open loop's growing
arrivals, extension blocks), ``sequential`` (the in-run decision: stop a point when its verdict
is certain, extend it while it is not), ``watchers`` (loop lag, the metrics scraper, progress),
``dispatcher`` (timed sends), ``transport`` and ``connection`` (plain-HTTP/1.1 with kernel
receive stamps), ``sse`` (the event-stream reader), ``records`` (the per-request record and the
latency definitions). ``inputs`` is the manifest content a measurement reads; ``sweep`` runs one
point, ``shards`` splits one over K client processes; ``target``, ``managed`` and ``cluster``
are the system under test. ``lock`` keeps one measurement per target at a time across
invocations, and ``lifeline`` makes a measurement's processes die with what started them.
"""
