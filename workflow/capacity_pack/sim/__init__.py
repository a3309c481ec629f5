"""The embedded simulated engine: an OpenAI-compatible server whose latencies come from a model.

It behaves, from the outside, like a vLLM server under load: requests queue, are batched
continuously with chunked prefill, compete for KV-cache blocks (preemption when they run out),
reuse cached prefixes, and are rejected when the waiting queue is full; all of it shows in the
streamed latencies and in ``/metrics``. It is the default target of every pack, so a full pack
runs on a laptop, and its ground-truth log measures the load generator's own error.

Modules:

- :mod:`~capacity_pack.sim.profile`: profiles (YAML) and their derived memory figures;
- :mod:`~capacity_pack.sim.perf`: the step-time formulas;
- :mod:`~capacity_pack.sim.kv`: the KV block pool and prefix cache;
- :mod:`~capacity_pack.sim.scheduler`: the vLLM-V1-like scheduler;
- :mod:`~capacity_pack.sim.virtual`: virtual-time runs for calibration and tests;
- :mod:`~capacity_pack.sim.engine`: the wall-clock step loop and faults, on
  :mod:`~capacity_pack.sim.pacing` (clock, deadline timer), reporting through
  :mod:`~capacity_pack.sim.engine_report` (metrics, ground truth);
- :mod:`~capacity_pack.sim.server`: the HTTP API (request bodies:
  :mod:`~capacity_pack.sim.request_params`; streams: :mod:`~capacity_pack.sim.streaming`; errors:
  :mod:`~capacity_pack.sim.wire`; uvicorn: :mod:`~capacity_pack.sim.serving`);
  :mod:`~capacity_pack.sim.control`: who may steer it (control token, ``Host`` check);
- :mod:`~capacity_pack.sim.cluster`: replicas behind a router (what it knows of them:
  :mod:`~capacity_pack.sim.replicas`; their processes: :mod:`~capacity_pack.sim.supervisor`;
  routing: :mod:`~capacity_pack.sim.routing`; relaying: :mod:`~capacity_pack.sim.relay`);
  :mod:`~capacity_pack.sim.fleet`: the same in virtual time; :mod:`~capacity_pack.sim.metrics`:
  Prometheus text format;
- :mod:`~capacity_pack.sim.cli`: ``capacity-pack sim serve | cluster | profiles``.
"""

from capacity_pack.sim.profile import Profile, ProfileError, load_profile, shipped_profiles

__all__ = ["Profile", "ProfileError", "load_profile", "shipped_profiles"]
