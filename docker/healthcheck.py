"""Container healthcheck: exit 0 when the aggview server at ADDRESS reports SERVING on the
standard gRPC health service (grpc.health.v1.Health), 1 otherwise.

    python docker/healthcheck.py 127.0.0.1:7070
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str]) -> int:
    address = argv[1] if len(argv) > 1 else "127.0.0.1:7070"
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=3
            )
    except grpc.RpcError as exc:
        print(f"{address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    print(f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
