"""What the two client shells share: the settings, the channel to the address given, the
:class:`~aggclient.core.ClientCore` that decides, and errors worded for the user."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from aggclient.core import SILENT_AFTER, ClientCore
from aggview import errors
from aggview.net import GRPC_OPTIONS
from aggview.retry import RetryPolicy
from aggview.security import client_credentials
from aggview.status import error_from_rpc
from aggview.wire import client_pb2_grpc as pb_grpc

# How a hint at a TLS mismatch tells the Python client's user to connect (the command line
# names its options instead: ``Client.tls_settings``).
TLS_SETTINGS = "ca= (its CA certificate) and token="


def _explain(exc: grpc.RpcError, plaintext: bool, settings: str) -> errors.AggviewError:
    """The server's error; a connection that fails gets a hint at the likely cause: nothing
    listening, or a TLS mismatch (``settings``: how to give the CA and a token)."""
    error = error_from_rpc(exc)
    text = str(error)
    if not isinstance(error, errors.Unavailable):
        return error
    if "connection refused" in text.lower():
        return errors.Unavailable(f"{text} (nothing listens there: is the cluster running?)")
    if plaintext and "failed to connect" in text:
        return errors.Unavailable(
            f"{text} (this client speaks plaintext: if the cluster runs with TLS, connect "
            f"with {settings})"
        )
    if not plaintext and "handshake" in text.lower():
        return errors.Unavailable(
            f"{text} (TLS handshake failed: the server may be plaintext (--insecure), or the "
            "CA given is not the one that signed its certificate)"
        )
    return error


CaSource = str | Path | bytes


def _open_channel(
    channels: Any,
    address: str,
    ca: CaSource | None,
    tls: bool | None,
    token: str | None,
    options: Sequence[tuple[str, Any]],
) -> tuple[Any, Any, bool]:
    """(channel, call metadata, plaintext?) from ``grpc`` or ``grpc.aio`` alike."""
    credentials, metadata = client_credentials(ca, tls, token)
    channel_options = [*GRPC_OPTIONS, *options]
    if credentials is None:
        return channels.insecure_channel(address, options=channel_options), metadata, True
    channel = channels.secure_channel(address, credentials, options=channel_options)
    return channel, metadata, False


class ClientBase:
    """The constructor and state both shells share (see :class:`~aggclient.client.Client` for
    the arguments); ``channels`` is ``grpc`` or ``grpc.aio``."""

    channels: Any = grpc
    tls_settings = TLS_SETTINGS  # how a TLS-mismatch hint says to connect (see _explain)

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        ca: CaSource | None = None,
        tls: bool | None = None,
        token: str | None = None,
        options: Sequence[tuple[str, Any]] = (),
        route: bool = True,
        silent_after: float | None = SILENT_AFTER,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.retries = 0  # timestamp-order aborts retried so far
        self.last_member: int | None = None  # the member the last commit went to (None: given)
        self._core = ClientCore(address, route=route, silent_after=silent_after)
        self._channel, self._metadata, self._plaintext = _open_channel(
            self.channels, address, ca, tls, token, options
        )
        self._stub = pb_grpc.AggviewStub(self._channel)
        self._open = lambda member: _open_channel(self.channels, member, ca, tls, token, options)[0]
        self._opened(ca, tls, token)

    def _opened(self, ca: CaSource | None, tls: bool | None, token: str | None) -> None:
        """What a shell keeps beyond the channel (its own state)."""

    @property
    def silent_after(self) -> float | None:
        """See :class:`~aggclient.client.Client` (None: a commit is waited for up to
        ``timeout``)."""
        return self._core.silent_after

    @silent_after.setter
    def silent_after(self, seconds: float | None) -> None:
        self._core.silent_after = seconds

    def _retried(self, exc: BaseException, failed: int, wait: float) -> None:
        self.retries += 1

    def _explained(self, exc: grpc.RpcError) -> errors.AggviewError:
        return _explain(exc, self._plaintext, self.tls_settings)
