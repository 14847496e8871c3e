"""The coordinator: catalog, timestamp oracle, two-phase commit, and the Python client."""

from aggview.errors import ConditionFailed
from coordinator.client import AsyncClient, Client

__all__ = ["AsyncClient", "Client", "ConditionFailed"]
