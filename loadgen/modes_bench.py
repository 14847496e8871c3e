"""``aggview bench modes``: the comparison the mission asks for, on the thesis's dashboard
stream: no view, the CloudTPS modes (sync; async at 100 ms and 1 s) and Cumulus (speculative on
1, 2 and 4 DW nodes; conservative on 2; and an epoch a second with changes fed every 50 ms,
whose tentative reads are measured too), each on a cluster of its own with the same data. For
each it reports write throughput (and its ratio to no view), p50/p99 commit latency, freshness
(from a probe's commit to a read that holds it), the share of reads under load that were the
exact answer at their timestamp, and whether the view was exact at the end.

It is the dashboard benchmark (``loadgen.dashboard_bench``) with these modes and smaller
defaults; every option of ``aggview bench dashboard`` applies.

    aggview bench modes                         # about 3 minutes on 2 cores
    aggview bench modes --hot                   # every event into one group
    aggview bench modes --sizes 1 --seconds 3 --modes none sync cumulus:100:2
"""

from __future__ import annotations

import argparse
from typing import Any

from loadgen import dashboard_bench

DEFAULT_MODES = [
    "none",
    "sync",
    "async:100",
    "async:1000",
    "cumulus:100:1",
    "cumulus:100:2",
    "cumulus:100:4",
    "cumulus:100:2:conservative",
    "cumulus:1000:2:feed50",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    dashboard_bench.add_arguments(parser)
    parser.set_defaults(modes=DEFAULT_MODES, sizes=[1, 10], seconds=4.0, out="aggview-modes")


def run(args: argparse.Namespace, options: dict[str, Any]) -> None:
    dashboard_bench.run(args, options)
