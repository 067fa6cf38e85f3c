"""Hypothesis profiles: ``default`` (fast, for development), ``ci`` (derandomized, at least
200 examples for cheap laws; selected by ``.ci/run``) and ``thorough`` (2,000 examples).

Select one with ``HYPOTHESIS_PROFILE=ci``. Laws that are expensive per example set their own
``max_examples`` with ``@settings``; a profile only scales the cheap ones.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=50, deadline=None)
settings.register_profile(
    "ci", max_examples=200, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
