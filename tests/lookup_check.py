"""Finds wrong answers of the coordinator's lookup cache in the logs of the clusters tests ran
(their coordinators run with ``AGGVIEW_LOOKUP_CACHE_CHECK=1``, set in conftest)."""

from __future__ import annotations

from pathlib import Path

MISMATCH = "lookup cache mismatch"


def lookup_mismatches(root: Path) -> list[str]:
    """Lines of coordinator (or coordinating member) logs under ``root`` where the lookup
    cache answered wrongly."""
    logs = [*root.rglob("coordinator.log*"), *root.rglob("member-*.log*")]
    return [
        line
        for log in logs
        for line in log.read_text(errors="replace").splitlines()
        if MISMATCH in line
    ]
