"""``aggview certs DIR``: a development certificate authority and the files a secure cluster
reads from its ``--tls-dir``.

What it writes, and who uses it:

* ``ca.pem`` (``ca-key.pem`` stays with whoever signs more certificates): every server and
  client trusts this CA;
* ``server.pem`` / ``server-key.pem``: the coordinator's and the LTMs' server certificate, valid
  for ``localhost``, ``127.0.0.1``, ``::1`` and every ``--host`` given;
* ``client.pem`` / ``client-key.pem``: the cluster *members'* client certificate (the
  coordinator calling LTMs, an LTM calling the coordinator back). LTMs require it (mutual TLS);
  applications never get it: they authenticate with tokens;
* ``cluster.secret``: a random secret members also send as a header, so the member-only
  services on the coordinator's public port (transaction outcomes) refuse applications;
* ``tokens``: one application token per role (``read``, ``write``, ``admin``).

Keys are EC P-256 (fast handshakes), private files are written with mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import string
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aggview import errors

MEMBER_NAME = "aggview-member"
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
FILES = (
    "ca.pem",
    "ca-key.pem",
    "server.pem",
    "server-key.pem",
    "client.pem",
    "client-key.pem",
    "cluster.secret",
    "tokens",
)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "aggview development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: object, days: int
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _key_usage(
    *, key_agreement: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    """A signing key's usages: digital signatures, and what else is named; every other usage
    off (``x509.KeyUsage`` asks for all nine)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=key_agreement,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _leaf(
    common_name: str,
    usage: x509.ObjectIdentifier,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    days: int,
    hosts: list[str],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    builder = (
        _builder(_name(common_name), ca.subject, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(key_agreement=True),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), critical=False
        )
    return builder.sign(ca_key, hashes.SHA256()), key


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, private: bool) -> None:
    """Private files are created 0600 from the start, never readable by others meanwhile."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    if private:
        os.chmod(path, 0o600)


_TOKEN_START = string.ascii_letters + string.digits


def new_token() -> str:
    """A fresh random token that starts with a letter or digit, so ``--token T`` takes it
    (a URL-safe token may start with ``-``, which argparse reads as an option)."""
    return secrets.choice(_TOKEN_START) + secrets.token_urlsafe(24)


def token_lines() -> str:
    """A tokens file with one fresh token per role (format: ``TOKEN ROLE [NAME]`` lines)."""
    lines = ["# aggview client tokens: TOKEN ROLE [NAME]; roles: read, write, admin (DDL)"]
    for role in ("read", "write", "admin"):
        lines.append(f"{new_token()} {role} {role}-client")
    return "\n".join(lines) + "\n"


def make_certs(
    directory: Path, *, hosts: list[str] | None = None, days: int = 365, force: bool = False
) -> list[Path]:
    """Writes a fresh CA, server and member certificates, a cluster secret and tokens."""
    if days < 1:
        raise errors.InvalidArgument("--days must be at least 1")
    directory.mkdir(parents=True, exist_ok=True)
    existing = [name for name in FILES if (directory / name).exists()]
    if existing and not force:
        raise errors.AlreadyExists(
            f"{directory} already holds {', '.join(existing)}; pass --force to replace them "
            "(a running cluster keeps using the old ones until restarted)"
        )
    all_hosts = list(dict.fromkeys([*DEFAULT_HOSTS, *(hosts or [])]))
    ca_key = _key()
    ca_name = _name("aggview development CA")
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(key_cert_sign=True, crl_sign=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    server, server_key = _leaf(
        "aggview-server", ExtendedKeyUsageOID.SERVER_AUTH, ca, ca_key, days, all_hosts
    )
    client, client_key = _leaf(
        MEMBER_NAME, ExtendedKeyUsageOID.CLIENT_AUTH, ca, ca_key, days, [MEMBER_NAME]
    )
    contents = {
        "ca.pem": (_pem(ca), False),
        "ca-key.pem": (_key_pem(ca_key), True),
        "server.pem": (_pem(server) + _pem(ca), False),
        "server-key.pem": (_key_pem(server_key), True),
        "client.pem": (_pem(client) + _pem(ca), False),
        "client-key.pem": (_key_pem(client_key), True),
        "cluster.secret": (secrets.token_hex(32).encode() + b"\n", True),
        "tokens": (token_lines().encode(), True),
    }
    written = []
    for name in FILES:
        data, private = contents[name]
        _write(directory / name, data, private)
        written.append(directory / name)
    return written
