"""Who may call what: the TLS material of a cluster, client tokens with roles, and the server
interceptors that check them.

* Every endpoint speaks TLS when a server is given a ``--tls-dir`` (see :mod:`aggview.certs`);
  a server without one must be told ``--insecure`` (plaintext is never a silent default).
* Applications authenticate to the coordinator with ``authorization: Bearer TOKEN``; each token
  has a role: ``read`` (Get, Scan, View, SELECT), ``write`` (also Commit, Refresh) or ``admin``
  (also DDL: any other SQL statement). Roles are checked before the request runs.
* Cluster members (the coordinator, the LTMs) prove membership with the members' client
  certificate (LTMs require it: mutual TLS) and the ``x-aggview-cluster`` secret header (also
  what the coordinator's member-only outcome service checks, on its public port). On a
  member's framed-TCP port, a member stream needs both the certificate and the secret in its
  hello; a client's transactions there need its token in the hello instead.

The coordinator's interceptor (tokens, roles, per-client limits) is
:class:`coordinator.gate.ClientGate`; this module holds what LTMs, the coordinator and clients
share.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import inspect
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from aggview import errors, status

TOKEN_HEADER = "authorization"
MEMBER_HEADER = "x-aggview-cluster"
ROLES = {"read": 1, "write": 2, "admin": 3}
# Services anyone may call: health checks carry no data.
OPEN_SERVICE_PREFIXES = ("grpc.health.v1.",)
MIN_TOKEN_CHARS = 16
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")
CERTS_HINT = "make a directory with `aggview certs DIR`"


@dataclass(frozen=True)
class TlsDir:
    """The files of a ``--tls-dir``, read once at start."""

    directory: Path
    ca: bytes
    server_cert: bytes
    server_key: bytes = field(repr=False)  # never in a log line or a traceback
    client_cert: bytes
    client_key: bytes = field(repr=False)
    secret: str = field(repr=False)

    @classmethod
    def load(cls, directory: str | Path) -> TlsDir:
        root = Path(directory)

        def read(name: str) -> bytes:
            path = root / name
            try:
                return path.read_bytes()
            except OSError as exc:
                raise errors.InvalidArgument(
                    f"TLS directory {root}: cannot read {name} ({exc.strerror}); {CERTS_HINT}"
                ) from None

        secret = read("cluster.secret").decode(errors="replace").strip()
        if len(secret) < MIN_TOKEN_CHARS:
            raise errors.InvalidArgument(
                f"{root / 'cluster.secret'} is too short (at least {MIN_TOKEN_CHARS} characters)"
            )
        return cls(
            root,
            ca=read("ca.pem"),
            server_cert=read("server.pem"),
            server_key=read("server-key.pem"),
            client_cert=read("client.pem"),
            client_key=read("client-key.pem"),
            secret=secret,
        )

    def server_credentials(self, *, members_only: bool) -> grpc.ServerCredentials:
        """``members_only`` (LTMs) also requires the members' client certificate."""
        return grpc.ssl_server_credentials(
            [(self.server_key, self.server_cert)],
            root_certificates=self.ca,
            require_client_auth=members_only,
        )

    def member_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.client_key, self.client_cert)

    @property
    def member_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((MEMBER_HEADER, self.secret),)

    @functools.cached_property
    def frames_server_ssl(self) -> ssl.SSLContext:
        """A member's framed-TCP server (aggview/frames.py). A member presents the members'
        certificate (verified here against the CA, and required with the secret for every
        member stream: see ``ltm.server.framed_exchange``); an application client presents
        none and its token instead, as on the gRPC port. Made once per process."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=self.ca.decode())
        context.load_cert_chain(self.directory / "server.pem", self.directory / "server-key.pem")
        context.verify_mode = ssl.CERT_OPTIONAL
        return context

    @functools.cached_property
    def member_client_ssl(self) -> ssl.SSLContext:
        """A member dialling another's framed-TCP server with the members' certificate (made
        once per process, shared by every partition's channel and the clock)."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=self.ca.decode())
        context.load_cert_chain(self.directory / "client.pem", self.directory / "client-key.pem")
        return context


def member_channel(
    address: str, tls: TlsDir | None, options: Sequence[tuple[str, Any]]
) -> grpc.aio.Channel:
    """A channel from one cluster member to another: mutual TLS, or plaintext when insecure."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.member_credentials(), options=options)


def member_metadata(tls: TlsDir | None) -> tuple[tuple[str, str], ...]:
    return tls.member_metadata if tls is not None else ()


def member_secret(tls: TlsDir | None) -> str:
    """What a member presents on framed TCP (``aggview.frames``): empty when insecure."""
    return tls.secret if tls is not None else ""


def is_secret(presented: str | None, secret: str) -> bool:
    """The one rule for a presented member secret (gRPC metadata or a framed hello)."""
    return presented is not None and hmac.compare_digest(presented.encode(), secret.encode())


# --------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class Token:
    role: str
    name: str


def load_tokens(path: str | Path) -> dict[str, Token]:
    """Reads a tokens file: one ``TOKEN ROLE [NAME]`` per line, ``#`` starts a comment."""
    source = Path(path)
    try:
        text = source.read_text()
    except OSError as exc:
        raise errors.InvalidArgument(f"cannot read tokens file {source}: {exc.strerror}") from None
    tokens: dict[str, Token] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = f"{source}:{number}"
        if len(fields) not in (2, 3):
            raise errors.InvalidArgument(f"{where}: expected TOKEN ROLE [NAME]")
        token, role = fields[0], fields[1].lower()
        if role not in ROLES:
            raise errors.InvalidArgument(
                f"{where}: unknown role {fields[1]!r}; roles are {', '.join(ROLES)}"
            )
        if len(token) < MIN_TOKEN_CHARS or not _TOKEN_CHARS.fullmatch(token):
            raise errors.InvalidArgument(
                f"{where}: a token needs at least {MIN_TOKEN_CHARS} characters of "
                "letters, digits and ._~+/=-"
            )
        if token in tokens:
            raise errors.InvalidArgument(f"{where}: the same token is listed twice")
        fingerprint = hashlib.sha256(token.encode()).hexdigest()[:8]
        tokens[token] = Token(role, fields[2] if len(fields) == 3 else f"{role}-{fingerprint}")
    if not tokens:
        raise errors.InvalidArgument(f"tokens file {source} lists no token")
    return tokens


def token_for(path: str | Path, role: str) -> str:
    """The first token of exactly ``role`` in a tokens file (tests, the command line)."""
    for token, entry in load_tokens(path).items():
        if entry.role == role:
            return token
    raise errors.InvalidArgument(f"tokens file {path} has no {role} token")


# --------------------------------------------------------------------------- interceptors

Behavior = Callable[..., Any]


def metadata_value(metadata: Sequence[tuple[str, Any]] | None, key: str) -> str | None:
    for name, value in metadata or ():
        if name == key:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return None


def rebuild(handler: grpc.RpcMethodHandler, behavior: Behavior) -> grpc.RpcMethodHandler:
    """A handler of the same kind and serializers as ``handler`` that runs ``behavior``."""
    kind = (handler.request_streaming, handler.response_streaming)
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[kind]
    return make(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _inner(handler: grpc.RpcMethodHandler) -> Behavior:
    return (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )


def denied(handler: grpc.RpcMethodHandler, exc: errors.AggviewError) -> Any:
    async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
        await status.abort(context, exc)

    return rebuild(handler, deny)


def guarded(
    handler: grpc.RpcMethodHandler,
    check: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Callable[[], None]]],
) -> grpc.RpcMethodHandler:
    """Runs ``check(request, context)`` before the method (it may abort); what it returns is
    called when the method is done, whatever its outcome (releases a slot)."""
    inner = _inner(handler)
    if not inspect.isasyncgenfunction(inner):  # a unary answer, or a stream sent by writes

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            release = await check(request, context)
            try:
                return await inner(request, context)
            finally:
                release()

        return rebuild(handler, call)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        release = await check(request, context)
        try:
            async for item in inner(request, context):
                yield item
        finally:
            release()

    return rebuild(handler, streaming)


def member_check(
    handler: grpc.RpcMethodHandler,
    metadata: Sequence[tuple[str, Any]] | None,
    secret: str,
    method: str,
) -> grpc.RpcMethodHandler:
    presented = metadata_value(metadata, MEMBER_HEADER)
    if not is_secret(presented, secret):
        return denied(handler, errors.Unauthenticated(f"{method} is for cluster members only"))
    return handler


class MemberGate(grpc.aio.ServerInterceptor):
    """An LTM's door (behind mutual TLS): every call but health checks carries the secret."""

    def __init__(self, secret: str) -> None:
        self.secret = secret

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or details.method.lstrip("/").startswith(OPEN_SERVICE_PREFIXES):
            return handler
        metadata = details.invocation_metadata  # type: ignore[attr-defined]
        return member_check(handler, metadata, self.secret, details.method)


# --------------------------------------------------------------------------- client side


def read_ca(ca: str | Path | bytes) -> bytes:
    """PEM bytes, a PEM file, or a directory holding ``ca.pem``."""
    if isinstance(ca, bytes):
        return ca
    path = Path(ca)
    if path.is_dir():
        path = path / "ca.pem"
    try:
        return path.read_bytes()
    except OSError as exc:
        raise errors.InvalidArgument(f"cannot read CA certificate {path}: {exc.strerror}") from None


def client_ssl(ca: str | Path | bytes | None, tls: bool | None) -> ssl.SSLContext | None:
    """An application client's TLS to a member's framed port (None: plaintext): the server
    checked against the cluster's CA (or the system's roots), no certificate of its own."""
    if not (tls if tls is not None else ca is not None):
        return None
    if ca is None:
        return ssl.create_default_context()
    return ssl.create_default_context(cadata=read_ca(ca).decode())


def client_credentials(
    ca: str | Path | bytes | None, tls: bool | None, token: str | None
) -> tuple[grpc.ChannelCredentials | None, tuple[tuple[str, str], ...]]:
    """Channel credentials (None: plaintext) and call metadata of an application client."""
    secure = tls if tls is not None else ca is not None
    if ca is not None and not secure:
        raise errors.InvalidArgument("ca= given with tls=False")
    if token is not None and not secure:
        raise errors.InvalidArgument(
            "a token is only sent over TLS (anyone on the path could read it): pass ca= "
            "(the cluster's CA certificate) or tls=True"
        )
    credentials = None
    if secure:
        credentials = grpc.ssl_channel_credentials(read_ca(ca) if ca is not None else None)
    metadata = ((TOKEN_HEADER, f"Bearer {token}"),) if token is not None else ()
    return credentials, metadata
