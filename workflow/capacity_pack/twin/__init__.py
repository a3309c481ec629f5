"""The engine model as a twin of the target: predictions in virtual time, and its calibration.

- :mod:`capacity_pack.twin.virtual_point`, :mod:`capacity_pack.twin.requests` and
  :mod:`capacity_pack.twin.preflight`: a pack's planned points run in virtual time on the
  target's engine model (the simulated target's own profile, or a calibrated one) and judged as
  a measured point is, before anything is measured; the predicted capacity bracket;
- :mod:`capacity_pack.twin.architecture` and :mod:`capacity_pack.twin.calibrate`: a profile's
  free parameters fitted to the pack's measured closed-loop points, with their uncertainty;
- :mod:`capacity_pack.twin.validate`: the calibrated twin's prediction against the measured
  capacity, and whether it is trusted;
- :mod:`capacity_pack.twin.whatif`: the pack with one thing changed, asked of the twin.
- :mod:`capacity_pack.twin.boundary`: the engine model's own long-run SLO boundary of a
  simulated pack, without the search or a client (the reference a measured capacity is
  checked against);
- :mod:`capacity_pack.twin.trust`: whether a pack has a validated twin, whether it is trusted,
  and the label of its predictions (the plan drill of a real target runs on it).

The twin sits above the decision layer (it reuses the search's rates and the capacity rule) and
below the drills, which run their plans on it.
"""
