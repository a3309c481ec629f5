"""The engine model as a twin of the target: predictions in virtual time, and its calibration.

Preflight prediction (``virtual_point``, ``requests``, ``preflight``), calibration
(``architecture``, ``calibrate``), validation and trust (``validate``, ``trust``), what-if
(``whatif``), the model's own boundary (``boundary``) and the control variate (``control``).
It sits above the decision layer and below the drills. Docs: docs/twin.md.
"""
