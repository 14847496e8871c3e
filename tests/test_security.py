"""Security: TLS on every endpoint, client tokens with roles, a members-only LTM API, and
plaintext refused unless asked for. Real servers in real processes, on a secure cluster."""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from inflight import burst, scan_of

from aggclient import AsyncClient, Client
from agglauncher.cluster import LocalCluster
from aggview import certs, errors
from aggview.certs import FILES, MEMBER_NAME
from aggview.frames import FramedCall
from aggview.security import MEMBER_HEADER, TlsDir, load_tokens, token_for
from aggview.wire import client_pb2 as cpb
from aggview.wire import ltm_pb2 as lpb
from aggview.wire import ltm_pb2_grpc as lpb_grpc

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        tmp_path_factory.mktemp("secure"),
        ltms=2,
        processes=2,  # inflight.burst pauses member 1 under member 0's clients
        secure=True,
        limits={"max_client_transactions": 4},
    )
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        cluster.kill()


@pytest.fixture(scope="module")
def accounts(secure: LocalCluster) -> str:
    """A table with two rows and a view over it, made by an admin."""
    with Client(secure.address, **secure.client_options("admin")) as admin:
        admin.sql("CREATE TABLE accounts (id INT PRIMARY KEY, balance DECIMAL(12,2) NOT NULL)")
        admin.sql(
            "CREATE MATERIALIZED VIEW total AS SELECT COUNT(*) AS n, SUM(balance) AS s "
            "FROM accounts"
        )
        with admin.transaction() as tx:
            tx.insert("accounts", {"id": 1, "balance": Decimal("10")})
            tx.insert("accounts", {"id": 2, "balance": Decimal("20")})
    return "accounts"


def client(cluster: LocalCluster, role: str | None, **extra: object) -> Client:
    options = cluster.client_options(role or "read")
    if role is None:
        options.pop("token")
    return Client(cluster.address, timeout=20, **{**options, **extra})  # type: ignore[arg-type]


def assert_unchanged(cluster: LocalCluster) -> None:
    with client(cluster, "read") as reader:
        assert [r["id"] for r in reader.scan("accounts")] == [1, 2]
        assert reader.view("total")[0]["s"] == Decimal("30.00")


# --------------------------------------------------------------------------- certificates


def test_certs_command_makes_loadable_certificates(tmp_path: Path) -> None:
    target = tmp_path / "tls"
    done = subprocess.run(
        [sys.executable, "-m", "aggcli.cli", "certs", str(target), "--host", "db.example"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for name in FILES:
        assert (target / name).exists(), name
    for name in ("ca-key.pem", "server-key.pem", "client-key.pem", "cluster.secret", "tokens"):
        assert stat.S_IMODE((target / name).stat().st_mode) == 0o600, name

    ca = x509.load_pem_x509_certificate((target / "ca.pem").read_bytes())
    server = x509.load_pem_x509_certificate((target / "server.pem").read_bytes())
    member = x509.load_pem_x509_certificate((target / "client.pem").read_bytes())
    for leaf in (server, member):
        assert leaf.issuer == ca.subject
        ca_key = ca.public_key()
        assert isinstance(ca_key, ec.EllipticCurvePublicKey)
        ca_key.verify(
            leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(leaf.signature_hash_algorithm)
        )  # type: ignore[arg-type]
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "db.example"} <= set(names.get_values_for_type(x509.DNSName))
    assert "127.0.0.1" in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    assert member.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == MEMBER_NAME

    tls = TlsDir.load(target)  # what the servers read, and gRPC accepts it
    grpc.ssl_server_credentials([(tls.server_key, tls.server_cert)], tls.ca, True)
    assert {t.role for t in load_tokens(target / "tokens").values()} == {"read", "write", "admin"}

    again = subprocess.run(
        [sys.executable, "-m", "aggcli.cli", "certs", str(target)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert again.returncode == 2 and "--force" in again.stderr


def test_tokens_start_with_a_letter_or_digit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--token T`` must take every token certs writes; a URL-safe token may begin with '-'."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--token")
    monkeypatch.setattr(certs.secrets, "token_urlsafe", lambda n: "-" + "x" * (n + 7))
    forced = certs.new_token()  # even when the random part starts with '-'
    monkeypatch.undo()
    for token in [forced, *(certs.new_token() for _ in range(500))]:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{31,}", token), token
        assert parser.parse_args(["--token", token]).token == token
    lines = [line for line in certs.token_lines().splitlines() if not line.startswith("#")]
    assert all(re.match(r"[A-Za-z0-9]", line) for line in lines), lines


# --------------------------------------------------------------------------- tokens and roles


def test_no_token_is_unauthenticated(secure: LocalCluster, accounts: str) -> None:
    with client(secure, None) as anonymous:
        for call in (
            lambda: anonymous.get(accounts, {"id": 1}),
            lambda: anonymous.scan(accounts),
            lambda: anonymous.view("total"),
            lambda: anonymous.sql("SELECT * FROM accounts"),
            lambda: anonymous.commit([cpb.Operation(kind=cpb.Operation.DELETE, table=accounts)]),
        ):
            with pytest.raises(errors.Unauthenticated, match="no token"):
                call()
    with client(secure, None, token="x" * 32) as stranger:
        with pytest.raises(errors.Unauthenticated, match="unknown token"):
            stranger.scan(accounts)
    assert_unchanged(secure)


def test_read_token_cannot_write(secure: LocalCluster, accounts: str) -> None:
    with client(secure, "read") as reader:
        assert reader.get(accounts, {"id": 1})["balance"] == Decimal("10.00")
        assert len(reader.sql("SELECT * FROM accounts")) == 2
        with pytest.raises(errors.PermissionDenied, match="Commit needs the write role"):
            with reader.transaction() as tx:
                tx.delete(accounts, {"id": 1})
        with pytest.raises(errors.PermissionDenied, match="write role"):
            reader.refresh("total")
        with pytest.raises(errors.PermissionDenied, match="admin role"):
            reader.sql("DROP TABLE accounts")
        with pytest.raises(errors.PermissionDenied, match="UPDATE, DELETE needs the write role"):
            reader.sql(f"DELETE FROM {accounts} WHERE id = 1")
    assert_unchanged(secure)


def test_write_token_cannot_run_ddl(secure: LocalCluster, accounts: str) -> None:
    with client(secure, "write") as writer:
        with writer.transaction() as tx:
            tx.add(accounts, {"id": 1}, {"balance": 5})
        with writer.transaction() as tx:
            tx.add(accounts, {"id": 1}, {"balance": -5})
        for ddl in (
            "CREATE TABLE other (id INT PRIMARY KEY)",
            "DROP TABLE accounts",
            "CREATE MATERIALIZED VIEW v2 AS SELECT COUNT(*) AS n FROM accounts",
            "DROP MATERIALIZED VIEW total",
            "  /* a comment first */ drop table accounts",
        ):
            with pytest.raises(errors.PermissionDenied, match="DDL .* needs the admin role"):
                writer.sql(ddl)
        with pytest.raises(errors.PermissionDenied):  # not a SELECT: DDL until proven else
            writer.sql("SELEC oops")
        with pytest.raises(errors.InvalidArgument, match="syntax error"):  # refused before it runs
            writer.sql("SELECT * FROM (")
        assert len(writer.sql("select * from accounts -- a read")) == 2
        assert (
            "UPDATE 1"
            in writer.sql(
                f"BEGIN; UPDATE {accounts} SET balance = balance + 0 WHERE id = 1; COMMIT;"
            ).message
        )
    assert_unchanged(secure)


def test_every_client_rpc_has_a_role() -> None:
    """A new RPC without an entry needs admin (fail closed); this makes the choice explicit."""
    from coordinator.gate import METHOD_ROLES

    methods = {m.name for m in cpb.DESCRIPTOR.services_by_name["Aggview"].methods}
    assert methods - {"Sql"} == set(METHOD_ROLES), "add the new RPC to coordinator/gate.py"


def test_admin_can_run_ddl(secure: LocalCluster, accounts: str) -> None:
    with client(secure, "admin") as admin:
        admin.sql("CREATE TABLE scratch (id INT PRIMARY KEY)")
        admin.sql("CREATE MATERIALIZED VIEW scratch_n AS SELECT COUNT(*) AS n FROM scratch")
        admin.sql("DROP MATERIALIZED VIEW scratch_n")
        admin.sql("DROP TABLE scratch")
    assert_unchanged(secure)


def test_limit_on_calls_in_flight_is_per_token(secure: LocalCluster, accounts: str) -> None:
    """This cluster allows 4 calls in flight per token. With member 1 paused, 4 scans of the read
    token hang in flight, 2 more are refused at once naming the limit, and a call with another
    token is not refused; all finish once member 1 resumes, so the slots were given back."""
    outcomes = asyncio.run(burst(secure, scan_of(accounts), 6, other_role="write"))
    refused = [o for o in outcomes[:6] if isinstance(o, errors.AggviewError)]
    assert len(refused) == 2, outcomes
    for failure in refused:
        assert isinstance(failure, errors.LimitExceeded)
        assert "read-client has 4 calls in flight" in str(failure)
        assert "max_client_transactions" in str(failure)
    assert outcomes[6] == "pending then done"  # the write token's own slots
    assert_unchanged(secure)


# --------------------------------------------------------------------------- TLS required


def test_plaintext_client_fails_against_tls_server(secure: LocalCluster, accounts: str) -> None:
    with Client(secure.address, timeout=10) as plaintext:
        with pytest.raises(errors.Unavailable, match="this client speaks plaintext"):
            plaintext.scan(accounts)
    channel = grpc.insecure_channel(secure.member(0).address)
    with pytest.raises(grpc.RpcError) as failure:
        lpb_grpc.LtmStub(channel).Status(lpb.StatusRequest(), timeout=10)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()


def test_tls_client_fails_against_plaintext_server(cluster: LocalCluster, tmp_path: Path) -> None:
    from aggview.certs import make_certs

    make_certs(tmp_path / "tls")
    with Client(cluster.address, ca=tmp_path / "tls", timeout=10) as tls_client:
        with pytest.raises(errors.Unavailable, match="TLS handshake failed"):
            tls_client.scan("anything")


def test_a_token_is_never_sent_in_plaintext(cluster: LocalCluster) -> None:
    with pytest.raises(errors.InvalidArgument, match="only sent over TLS"):
        Client(cluster.address, token="t" * 32)


# --------------------------------------------------------------------------- members only


def test_non_members_cannot_call_the_ltm_api(secure: LocalCluster, accounts: str) -> None:
    assert secure.tls_dir is not None
    tls = TlsDir.load(secure.tls_dir)
    address = secure.member(0).address
    app_token = token_for(secure.tls_dir / "tokens", "admin")

    def status(credentials: grpc.ChannelCredentials, metadata: tuple = ()) -> grpc.StatusCode:  # type: ignore[type-arg]
        with grpc.secure_channel(address, credentials) as channel:
            try:
                lpb_grpc.LtmStub(channel).Status(lpb.StatusRequest(), timeout=10, metadata=metadata)
            except grpc.RpcError as exc:
                return exc.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    server_only = grpc.ssl_channel_credentials(tls.ca)  # what an application has
    member = tls.member_credentials()
    # a member's port serves applications too: without the cluster secret the LTM API is
    # refused, with an application's token or none
    assert status(server_only) == grpc.StatusCode.UNAUTHENTICATED
    assert status(server_only, (("authorization", f"Bearer {app_token}"),)) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    # the members' certificate without the cluster secret, or with a wrong one
    assert status(member) == grpc.StatusCode.UNAUTHENTICATED
    assert status(member, ((MEMBER_HEADER, "0" * 64),)) == grpc.StatusCode.UNAUTHENTICATED
    assert status(member, tls.member_metadata) == grpc.StatusCode.OK

    # the stream that carries prepares and decisions: refused before a message is read
    with grpc.secure_channel(address, member) as channel:
        stream = lpb_grpc.LtmStub(channel).Exchange(iter([lpb.LtmRequests()]), timeout=10)
        with pytest.raises(grpc.RpcError) as failure:
            list(stream)
        assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # the same stream on the members' framed-TCP port: mutual TLS, then the secret
    def framed(context: ssl.SSLContext, secret: str) -> str:
        async def first_answer() -> str:
            hello = lpb.ExchangeHello(secret=secret, partition=0, epoch=0).SerializeToString()
            call = FramedCall(
                secure.exchange_addresses[0], hello, lpb.LtmReplies.FromString, context
            )
            try:
                async for _ in call:
                    return "a member"
                return "closed"
            except Exception as exc:  # noqa: BLE001 - what the caller is told
                return str(exc)
            finally:
                call.cancel()

        return asyncio.run(first_answer())

    assert "without the cluster secret" in framed(tls.member_client_ssl, "0" * 64)
    no_certificate = ssl.create_default_context(cadata=tls.ca.decode())  # an application's
    assert "without the members' certificate" in framed(no_certificate, tls.secret)

    # the outcome service (members ask each other about transactions in doubt): members only
    with grpc.secure_channel(secure.address, server_only) as channel:
        query = lpb_grpc.TransactionOutcomeStub(channel).Query
        with pytest.raises(grpc.RpcError) as failure:
            query(
                lpb.OutcomeRequest(ts=[1]),
                timeout=10,
                metadata=(("authorization", f"Bearer {app_token}"),),
            )
        assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "members only" in (failure.value.details() or "")
        assert len(query(lpb.OutcomeRequest(ts=[1]), metadata=tls.member_metadata).outcomes) == 1
    assert_unchanged(secure)


def test_clients_transact_on_the_framed_ports_with_their_token(
    secure: LocalCluster, accounts: str
) -> None:
    """A secure cluster's members take clients' transactions on their framed-TCP ports too:
    TLS checked against the cluster's CA, the token in the hello, checked as on gRPC. A read
    token is refused there with PERMISSION_DENIED, an unknown one or none UNAUTHENTICATED, at
    once (no retries), and the data stays as it was."""
    with client(secure, "admin") as admin:
        admin.sql("CREATE TABLE framed_rows (id INT PRIMARY KEY, n INT NOT NULL)")

    async def write(role: str) -> tuple[list[object], list[object]]:
        async with AsyncClient(secure.address, **secure.client_options(role)) as writer:

            async def insert(i: int) -> object:
                try:
                    async with writer.transaction() as tx:
                        tx.insert("framed_rows", {"id": i, "n": i})
                    return i
                except errors.AggviewError as exc:
                    return exc

            outcomes = await asyncio.gather(*(insert(i) for i in range(4)))
            calls = [stream._call for _, _, stream in writer._members.values()]
            return list(outcomes), calls

    outcomes, calls = asyncio.run(write("write"))
    assert outcomes == [0, 1, 2, 3]
    assert calls and all(isinstance(call, FramedCall) for call in calls)
    outcomes, _ = asyncio.run(write("read"))
    assert all(isinstance(o, errors.PermissionDenied) for o in outcomes), outcomes
    assert "Transact needs the write role" in str(outcomes[0])

    assert secure.tls_dir is not None
    application = ssl.create_default_context(cadata=TlsDir.load(secure.tls_dir).ca.decode())

    async def transact_with(token: str) -> BaseException:
        hello = lpb.ExchangeHello(stream="transact", token=token).SerializeToString()
        call = FramedCall(
            secure.exchange_addresses[1], hello, cpb.TransactReplies.FromString, application
        )
        try:
            await call.write(cpb.TransactRequests())
            async for _ in call:
                pass
        except errors.AggviewError as exc:
            return exc
        finally:
            call.cancel()
        raise AssertionError("the stream was not refused")

    assert isinstance(asyncio.run(transact_with("x" * 32)), errors.Unauthenticated)
    refused = asyncio.run(transact_with(""))
    assert isinstance(refused, errors.Unauthenticated) and "no token" in str(refused)
    with client(secure, "read") as reader:
        assert sorted(r["id"] for r in reader.scan("framed_rows")) == [0, 1, 2, 3]
    assert_unchanged(secure)


# --------------------------------------------------------------------------- the command line


def _aggview(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aggcli.cli", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )


def test_servers_refuse_plaintext_unless_told(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'store.db'}"
    for args in (
        ["start", "--data", str(tmp_path / "data")],
        ["ltm", "--store", store, "--log-dir", str(tmp_path / "l"), "--partitions", "1"],
    ):
        done = _aggview(*args)
        assert done.returncode == 2, done
        assert "refusing to serve plaintext" in done.stderr and "--insecure" in done.stderr


def test_start_with_tls_dir_and_sql_command(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    assert _aggview("certs", str(tls)).returncode == 0
    process = subprocess.Popen(
        [sys.executable, "-m", "aggcli.cli", "start", "--data", str(tmp_path / "data")]
        + ["--ltms", "1", "--tls-dir", str(tls)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.match(r"aggview listening on (\S+)", line)
        assert match, line
        address = match.group(1)
        created = _aggview(
            "sql", "--tls-dir", str(tls), address, "CREATE TABLE t (id INT PRIMARY KEY)"
        )
        assert "created table t" in created.stdout, created
        plaintext = _aggview("sql", address, "SELECT * FROM t")
        assert plaintext.returncode == 2 and "plaintext" in plaintext.stderr
        read_token = token_for(tls / "tokens", "read")
        denied = _aggview(
            "sql", "--ca", str(tls / "ca.pem"), "--token", read_token, address, "DROP TABLE t"
        )
        assert denied.returncode == 2 and "admin role" in denied.stderr
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=60)
    assert "aggview stopped" in out


# --------------------------------------------------------------------------- server reflection


def reflected_services(channel: grpc.Channel) -> set[str]:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    return set(ProtoReflectionDescriptorDatabase(channel).get_services())


def test_every_server_answers_reflection(cluster: LocalCluster) -> None:
    """What `grpcurl -plaintext HOST:PORT list` asks, against an --insecure cluster."""
    with grpc.insecure_channel(cluster.address) as channel:
        services = reflected_services(channel)
    assert {"aggview.v1.Aggview", "grpc.health.v1.Health"} <= services, services
    with grpc.insecure_channel(cluster.member(0).address) as channel:
        assert "aggview.v1.Ltm" in reflected_services(channel)
    with grpc.insecure_channel(cluster.address) as channel:
        from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
            ProtoReflectionDescriptorDatabase,
        )

        described = ProtoReflectionDescriptorDatabase(channel).FindFileContainingSymbol(
            "aggview.v1.Aggview"
        )
    assert any(s.name == "Aggview" for s in described.service)


def test_reflection_on_a_tls_cluster_takes_the_ca_and_a_token(
    secure: LocalCluster, accounts: str
) -> None:
    ca = (secure.tls_dir / "ca.pem").read_bytes()  # type: ignore[operator]
    token = token_for(secure.tokens_path, "read")  # type: ignore[arg-type]
    with_token = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(ca), grpc.access_token_call_credentials(token)
    )
    with grpc.secure_channel(secure.address, with_token) as channel:
        assert "aggview.v1.Aggview" in reflected_services(channel)
    with grpc.secure_channel(secure.address, grpc.ssl_channel_credentials(ca)) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            reflected_services(channel)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_command_line_names_its_own_options_and_fails_fast(
    secure: LocalCluster, accounts: str
) -> None:
    """A plaintext ``aggview watch`` of a TLS cluster fails at once, its hint naming the
    command's options (not the Python client's ``ca=``); with --tls-dir it runs."""
    command = [sys.executable, "-m", "aggcli.cli"]
    started = time.monotonic()
    done = subprocess.run(
        [*command, "watch", secure.address, "total"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=30,
    )
    assert time.monotonic() - started < 15 and done.returncode == 2
    assert "connect with --tls-dir DIR" in done.stderr and "ca=" not in done.stderr, done.stderr
    assert secure.tls_dir is not None
    done = subprocess.run(
        [*command, "sql", secure.address, "SELECT n FROM total", "--tls-dir", str(secure.tls_dir)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=30,
    )
    assert done.stdout.splitlines()[:2] == ["n", "2"], done.stdout + done.stderr
