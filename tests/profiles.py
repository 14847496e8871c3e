"""How many examples the slow property tests run, by hypothesis profile (``HYPOTHESIS_PROFILE``):

* ``ci``, the default: fewer examples of the tests that each cost seconds (a cluster round
  trip or a whole program per example), so the suite stays within ten minutes on two cores;
* ``thorough``: the counts these tests were written with, and five times hypothesis's default
  for every other property test: ``HYPOTHESIS_PROFILE=thorough python -m pytest``.

conftest.py registers and loads the profile; a test's own count is ``examples(ci, thorough)``.
A per-test variable (``AGGVIEW_VIEW_EXAMPLES`` and the like) still overrides both."""

from __future__ import annotations

import os

PROFILES = ("ci", "thorough")
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in PROFILES:
    raise ValueError(f"HYPOTHESIS_PROFILE must be one of {', '.join(PROFILES)}; got {PROFILE!r}")


def examples(ci: int, thorough: int) -> int:
    """A property test's number of examples under the current profile."""
    return thorough if PROFILE == "thorough" else ci
