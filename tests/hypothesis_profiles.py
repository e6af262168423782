"""Hypothesis settings for this suite's property tests: `ci` (bounded, repeatable) and `dev` (more examples).

Chosen by the environment variable HYPOTHESIS_PROFILE (`ci` when unset). Test modules apply `PROFILE` as a
decorator instead of loading it globally, so that other tests and Hypothesis' own `ci` profile are unchanged;
the profiles are registered as `ckptqual-ci` and `ckptqual-dev`.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ckptqual-ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "ckptqual-dev",
    max_examples=300,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

PROFILE_NAME = os.environ.get("HYPOTHESIS_PROFILE", "ci")
# "ci" and "dev" name ours; any other registered profile name (Hypothesis' own "default", say) is used as is.
PROFILE: settings = settings.get_profile(f"ckptqual-{PROFILE_NAME}" if PROFILE_NAME in ("ci", "dev") else PROFILE_NAME)
