"""Shared test set-up: a headless plotting backend and a deterministic Hypothesis profile for CI."""

import os

import matplotlib
from hypothesis import HealthCheck, settings

matplotlib.use("Agg")

# In CI the same examples every run (a red build must be reproducible); locally, fresh ones.
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
