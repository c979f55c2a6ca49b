"""Shared test set-up: a headless plotting backend and a deterministic Hypothesis profile for CI."""

import os

import matplotlib
import pytest
from hypothesis import HealthCheck, settings

matplotlib.use("Agg")

# In CI the same examples every run (a red build must be reproducible); locally, fresh ones.
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True, scope="module")
def _environment_as_it_was():
    # Some libraries set process-wide variables as a side effect (OMP_NUM_THREADS, for one, lowers numpy's
    # BLAS threads); notebooks run by nbval later in the same session inherit os.environ, so each test
    # module leaves it as it found it.
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
