"""Wait until HBase answers real Thrift calls (not just an open port): create a probe table,
write and read a row, drop it. Exit 0 when that works, 1 after the timeout.

    python docker/wait_for_hbase.py hbase:9090 [--timeout 300]

The HBase Thrift server accepts connections well before the master and a region server are up;
an LTM started then would fail at its first store call, so compose starts LTMs after this.
"""

from __future__ import annotations

import argparse
import sys
import time

import happybase
from thriftpy2.thrift import TException

PROBE = "aggview_ready_probe"


def probe(host: str, port: int) -> None:
    connection = happybase.Connection(host, port, timeout=20_000)
    try:
        if PROBE.encode() not in connection.tables():
            connection.create_table(PROBE, {"d": {"max_versions": 1}})
        table = connection.table(PROBE)
        table.put(b"k", {b"d:v": b"ok"})
        if table.row(b"k").get(b"d:v") != b"ok":
            raise RuntimeError("probe row not read back")
        connection.delete_table(PROBE, disable=True)
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="HOST:PORT of HBase's Thrift server")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    host, _, port = args.address.rpartition(":")
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            probe(host, int(port))
        except (TException, OSError, RuntimeError) as exc:
            if time.monotonic() >= deadline:
                print(f"HBase at {args.address} not ready after {args.timeout:g}s: {exc!r}")
                return 1
            print(f"waiting for HBase at {args.address}: {exc!r}", flush=True)
            time.sleep(2)
        else:
            print(f"HBase at {args.address} answers Thrift calls", flush=True)
            return 0


if __name__ == "__main__":
    sys.exit(main())
