"""The Python client library: ``Client`` (blocking) and ``AsyncClient`` (asyncio), routing to
the member hosting most of a transaction's rows, view subscriptions and bulk access. Needs only
the wire and codecs of ``aggview``: an application installs no server code paths it runs."""

# isort: off
import aggview  # noqa: F401 - first: it turns gRPC's fork handlers off before grpc loads

# isort: on
from aggclient.client import AsyncClient, Client
from aggview.errors import ConditionFailed

__all__ = ["AsyncClient", "Client", "ConditionFailed"]
