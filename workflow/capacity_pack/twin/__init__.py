"""The engine model as a twin of the target: predictions in virtual time, and its calibration.

- :mod:`capacity_pack.twin.virtual_point` and :mod:`capacity_pack.twin.preflight`: a pack's
  planned points run in virtual time on the target's engine model (the simulated target's own
  profile, or a calibrated one), analyzed as a measured point is, before anything is measured;
- :mod:`capacity_pack.twin.calibrate`: a profile's free parameters fitted to the pack's
  measured closed-loop points, with their uncertainty;
- :mod:`capacity_pack.twin.requests`: a schedule's requests as the engine model's fleet takes
  them (shared prefixes, then token ids of each request's own), for the virtual points and the
  virtual failure drills.

The twin sits above the decision layer (it reuses the search's rates and the capacity rule) and
below the drills, which run their plans on it.
"""
