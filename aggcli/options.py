"""What the ``aggview`` commands share: the parser's help form, the server and client security
options (checked before anything starts), the member options, and a client from the options.
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import sys
from pathlib import Path
from typing import Any

from aggview import errors

# What a client's hint at a TLS mismatch names (the Python client's names its arguments).
CLI_TLS_SETTINGS = "--tls-dir DIR (or --ca FILE and --token T)"

PLAINTEXT_REFUSED = (
    "refusing to serve plaintext without authentication: pass --tls-dir DIR (TLS everywhere, "
    "client tokens; `aggview certs DIR` makes one), or --insecure (plaintext, anyone who can "
    "connect may do anything: one trusted machine only)"
)


def _shown(value: Any) -> str:
    """A default as the help shows it (argparse %-formats help, so % is doubled)."""
    if value is None or value == []:
        text = "none"
    elif isinstance(value, list | tuple):
        text = " ".join(map(str, value))
    else:
        text = str(value)
    return text.replace("%", "%%")


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.default is argparse.SUPPRESS
            or action.required
            or not action.option_strings
            or action.nargs == 0  # a flag: off unless given
            or "default" in text.lower()
        ):
            return text
        return f"{text} (default: {_shown(action.default)})".strip()

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and self._get_help_string(action):  # its default, at least
            action = copy.copy(action)
            action.help = self._get_help_string(action)
        return super()._format_action(action)


class Parser(argparse.ArgumentParser):
    """Shows defaults; ``intermixed``: options may come anywhere among the positionals
    (``aggview sql ADDRESS "SELECT ..." --format csv "SELECT ..."``)."""

    def __init__(self, *args: Any, intermixed: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        self._intermixed = intermixed
        self._mixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if not self._intermixed or self._mixing:  # intermixed parsing calls this twice
            return super().parse_known_args(args, namespace)
        self._mixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._mixing = False


def address_type(text: str) -> str:
    """HOST:PORT, checked: a bare host would make gRPC dial port 443."""
    from aggview.net import is_host_port  # gRPC's health and reflection: not at start

    if not is_host_port(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:7070)")
    return text


def add_server_security(parser: argparse.ArgumentParser, *, clients: bool) -> None:
    group = parser.add_argument_group("security (one of --tls-dir and --insecure is required)")
    group.add_argument(
        "--tls-dir",
        help="ca.pem, server.pem/-key.pem, client.pem/-key.pem, cluster.secret (aggview certs)"
        " (default: none)",
    )
    group.add_argument(
        "--insecure", action="store_true", help="plaintext, no tokens, no member check"
    )
    if clients:
        group.add_argument(
            "--tokens", help="client tokens, TOKEN ROLE [NAME] lines (default: TLS_DIR/tokens)"
        )
        group.add_argument(
            "--limit",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="override a limit, e.g. max_views=20 (repeated; the limits are listed in the "
            "README's Security section; default: none)",
        )


def server_tls_dir(args: argparse.Namespace) -> Path | None:
    """The TLS directory, or None for --insecure; plaintext is never a silent default."""
    if args.insecure and args.tls_dir:
        raise errors.InvalidArgument("give --tls-dir or --insecure, not both")
    if args.insecure:
        return None
    if not args.tls_dir:
        raise errors.InvalidArgument(PLAINTEXT_REFUSED)
    return Path(args.tls_dir)


def tokens_path(args: argparse.Namespace, tls_dir: Path | None) -> Path | None:
    if tls_dir is None:
        if args.tokens:
            raise errors.InvalidArgument("--tokens needs --tls-dir: tokens are only sent over TLS")
        return None
    return Path(args.tokens) if args.tokens else tls_dir / "tokens"


def refuse_taken_port(host: str, port: int) -> None:
    """A port in use is one line naming it, before any server starts (the server's own bind
    failure comes as gRPC's log line, or, under ``aggview start``, a member's traceback)."""
    if not port:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise errors.Unavailable(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def add_client_security(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security (a cluster started with --tls-dir)")
    group.add_argument("--ca", help="the cluster's CA certificate (ca.pem); default: none")
    group.add_argument(
        "--token", default=os.environ.get("AGGVIEW_TOKEN"), help="default: $AGGVIEW_TOKEN"
    )
    group.add_argument(
        "--tls-dir",
        dest="client_tls_dir",
        metavar="DIR",
        help="use DIR/ca.pem, and without --token the first admin token of DIR/tokens "
        "(default: none)",
    )


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Client keyword arguments the security flags of a command ask for."""
    from aggview.security import token_for

    ca, token = args.ca, args.token
    if args.client_tls_dir:
        directory = Path(args.client_tls_dir)
        ca = ca or directory / "ca.pem"
        if token is None and (directory / "tokens").exists():
            token = token_for(directory / "tokens", "admin")
    return {"ca": ca, "token": token}


def open_client(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """A blocking client for ``args.address`` with the security flags of the command, whose
    hints name those flags."""
    from aggclient.client import Client

    client = Client(args.address, **client_options(args))
    client.tls_settings = CLI_TLS_SETTINGS
    return client


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--no-fsync", action="store_true", help="skip fsync of logs (tests and demos only)"
    )


METRICS_HELP = (
    "serve Prometheus metrics over HTTP at /metrics on this port (0: a free one, printed at "
    "start; unauthenticated and plaintext even with --tls-dir). Default: none (off)"
)


NO_METRICS_HELP = (
    "keep no metrics at all (not even counted in memory: python -m bench.views "
    "--without-metrics measures what they cost); refuses --metrics-port"
)


def check_metrics_options(args: argparse.Namespace) -> None:
    """--no-metrics and --metrics-port contradict each other: one error naming both."""
    if args.no_metrics and args.metrics_port is not None:
        raise errors.InvalidArgument(
            "--no-metrics keeps no metrics: --metrics-port has none to serve"
        )


def add_member_options(parser: argparse.ArgumentParser) -> None:
    """What a coordinating process takes: its place among the members, its partitions'
    checkpoints and cache, and failover."""
    parser.add_argument(
        "--member-address",
        action="append",
        default=[],
        help="every coordinating member's address, in order (repeated; member 0 keeps the "
        "clock and the catalog); partition p is hosted by member p %% members",
    )
    parser.add_argument(
        "--member-exchange",
        action="append",
        default=[],
        help="where every member serves the other members' transaction streams on framed TCP, "
        "in member order (repeated; as many as --member-address). Without it, those streams go "
        "over gRPC, which costs each message about 15 times the CPU (python -m bench.messages)",
    )
    parser.add_argument(
        "--exchange-port",
        type=int,
        default=None,
        help="the port this member serves framed TCP on (default: its --member-exchange's)",
    )
    parser.add_argument("--member", type=int, default=0, help="which member this is")
    parser.add_argument("--metrics-port", type=int, default=None, help=METRICS_HELP)
    parser.add_argument("--no-metrics", action="store_true", help=NO_METRICS_HELP)
    parser.add_argument(
        "--take-lead",
        action="store_true",
        help="with --failover-after: this member leads the cluster (keeps the clock and the "
        "catalog) whoever led before; only for a start of every member at once (aggview start "
        "gives it to member 0). Without it a member follows the leader the store records",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        default=2.0,
        help="seconds between checkpoints of committed rows to the store",
    )
    parser.add_argument(
        "--cache-rows", type=int, default=1_000_000, help="rows each partition keeps in memory"
    )
    parser.add_argument(
        "--failover-after",
        type=float,
        default=0.0,
        help="seconds a member may stay silent before its partitions and decisions move to "
        "the next member, which holds their copies (0: never; needs --member-address): every "
        "member copies its logs to the next one, the leader moves a silent member's partitions "
        "and decisions, and the next member takes the lead from a silent leader",
    )


def say(text: str) -> None:
    print(f"aggview: {text}", file=sys.stderr, flush=True)
