"""What a running cluster says about itself (``aggview status``): its members from the member
asked (``Members``), then each member's own ``Status`` (the member-level reply of the ``Ltm``
service every member of a multi-member cluster serves): its role, term, partitions, the members
it hears, its views with their mode and lag, where it serves /metrics.

``Status`` is a members' call: in a secure cluster it needs the cluster's secret
(``cluster.secret`` of the TLS directory); without it a member is shown up or down only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc

from aggclient.base import CaSource, _explain, _open_channel
from aggclient.core import SILENT_CODES
from aggview import errors
from aggview.security import MEMBER_HEADER
from aggview.wire import client_pb2 as cpb
from aggview.wire import client_pb2_grpc as cpb_grpc
from aggview.wire import ltm_pb2 as lpb
from aggview.wire import ltm_pb2_grpc as lpb_grpc

# How long one member may take to answer before it counts as down (and the address asked
# first as unreachable).
STATUS_TIMEOUT = 3.0


@dataclass
class ViewInfo:
    name: str
    mode: str
    state: str
    lag_seconds: float | None = None  # since this member last refreshed it (None: not here)


@dataclass
class MemberInfo:
    member: int
    address: str
    up: bool
    role: str  # leader or follower
    term: int | None = None
    partitions: list[int] | None = None  # served here (None: not known)
    copies: list[int] | None = None  # partitions whose log it copies (replicated clusters)
    reaches: list[int] | None = None  # members it hears (replicated clusters)
    committed: int | None = None  # transactions it coordinated that committed
    tx_per_s: float | None = None  # its commits per second between two samples (``throughput``)
    metrics_port: int | None = None  # where it serves /metrics (0: nowhere)
    views: list[ViewInfo] = field(default_factory=list)
    note: str = ""  # why some figures are missing


@dataclass
class ClusterStatus:
    address: str
    partitions: int
    leader: int
    members: list[MemberInfo]
    tx_per_s: float | None = None  # the cluster's commits per second (``throughput``)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def throughput(before: ClusterStatus, after: ClusterStatus, seconds: float) -> ClusterStatus:
    """``after`` with each member's commits per second since ``before`` (``seconds`` earlier),
    and the cluster's: client and system commits (refreshes, epochs). A member not counted in
    both, or whose count went back (it restarted), has none; the cluster's sums the others."""
    counted = {m.member: m.committed for m in before.members}
    rates = []
    for m in after.members:
        earlier = counted.get(m.member)
        if m.committed is not None and earlier is not None and m.committed >= earlier:
            m.tx_per_s = (m.committed - earlier) / seconds
            rates.append(m.tx_per_s)
    after.tx_per_s = sum(rates) if rates else None
    return after


def cluster_status(
    address: str,
    *,
    ca: CaSource | None = None,
    token: str | None = None,
    secret: str | None = None,
    timeout: float = STATUS_TIMEOUT,
    tls_settings: str = "",
) -> ClusterStatus:
    """Asks ``address`` for the members, then each member for its status. An unreachable
    ``address`` raises ``Unavailable`` after ``timeout``; a member that does not answer is
    shown down."""
    channel, metadata, plaintext = _open_channel(grpc, address, ca, None, token, ())
    try:
        stub = cpb_grpc.AggviewStub(channel)
        try:
            members = stub.Members(cpb.MembersRequest(), timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                raise errors.Unavailable(
                    f"cannot reach {address}: no answer within {timeout:g} s"
                ) from None
            error = _explain(exc, plaintext, tls_settings or "--ca and --token")
            if isinstance(error, errors.Unavailable):
                raise errors.Unavailable(f"cannot reach {address}: {error}") from None
            raise error from None
        addresses = list(members.addresses) or [address]
        views = None if members.addresses else _views(stub, metadata, timeout)
    finally:
        channel.close()
    calls = [*metadata, *([(MEMBER_HEADER, secret)] if secret else [])]
    infos = [
        _member(m, a, members.leader, calls, ca, token, timeout) for m, a in enumerate(addresses)
    ]
    if views is not None:  # one process: the whole cluster, which has no Ltm service
        infos[0].views, infos[0].partitions = views, list(range(members.partitions))
        infos[0].note = ""
    return ClusterStatus(address, members.partitions, members.leader, infos)


def _member(
    member: int,
    address: str,
    leader: int,
    metadata: Sequence[tuple[str, str]],
    ca: CaSource | None,
    token: str | None,
    timeout: float,
) -> MemberInfo:
    role = "leader" if member == leader else "follower"
    info = MemberInfo(member, address, up=False, role=role)
    channel, _, _ = _open_channel(grpc, address, ca, None, token, ())
    try:
        try:
            reply = lpb_grpc.LtmStub(channel).Status(
                lpb.StatusRequest(), timeout=timeout, metadata=metadata
            )
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if code in SILENT_CODES:
                info.note = "does not answer"
                return info
            info.up = True
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                info.note = "details need the cluster's secret (--tls-dir DIR)"
            elif code != grpc.StatusCode.UNIMPLEMENTED:
                info.note = f"status failed: {exc.details()}"  # type: ignore[attr-defined]
            return info
    finally:
        channel.close()
    info.up = True
    info.role = "leader" if reply.leader == member else "follower"
    info.term = reply.term
    info.partitions = list(reply.serving)
    info.copies = list(reply.replicas)
    info.reaches = list(reply.reaches)
    info.committed = reply.coordinated
    info.metrics_port = reply.metrics_port
    info.views = [
        ViewInfo(v.name, v.mode, v.state, v.lag_seconds if v.HasField("lag_seconds") else None)
        for v in reply.views
    ]
    return info


def _views(stub: Any, metadata: Any, timeout: float) -> list[ViewInfo]:
    """The views as the client API describes them (a one-process cluster)."""
    import json

    listed = stub.List(cpb.ListRequest(), timeout=timeout, metadata=metadata)
    out = []
    for name in listed.views:
        described = stub.Describe(
            cpb.DescribeRequest(name=name), timeout=timeout, metadata=metadata
        )
        mode = json.loads(described.plan_json).get("mode", "")
        out.append(ViewInfo(name, mode, described.state))
    return out


def render_text(status: ClusterStatus) -> str:
    """One line for the cluster, one per member, one per view of each member."""
    rate = f", {status.tx_per_s:.1f} tx/s" if status.tx_per_s is not None else ""
    lines = [
        f"cluster at {status.address}: {len(status.members)} member(s), "
        f"{status.partitions} partition(s), leader: member {status.leader}{rate}"
    ]
    for m in status.members:
        parts = [f"member {m.member}", m.address, "up" if m.up else "DOWN", m.role]
        if m.term:
            parts.append(f"term {m.term}")
        if m.partitions is not None:
            parts.append(f"partitions {_numbers(m.partitions)}")
        if m.copies:
            parts.append(f"copies {_numbers(m.copies)}")
        if m.reaches:
            parts.append(f"reaches members {_numbers(m.reaches)}")
        if m.committed is not None:
            parts.append(f"committed {m.committed}")
        if m.tx_per_s is not None:
            parts.append(f"{m.tx_per_s:.1f} tx/s")
        if m.metrics_port:
            parts.append(f"metrics :{m.metrics_port}")
        if m.note:
            parts.append(f"({m.note})")
        lines.append("  ".join(parts))
        for v in m.views:
            lag = f"  lag {v.lag_seconds:.1f} s" if v.lag_seconds is not None else ""
            lines.append(f"    view {v.name}  {v.mode}  {v.state}{lag}")
    return "\n".join(lines)


def _numbers(values: list[int]) -> str:
    return ",".join(map(str, values)) or "none"
