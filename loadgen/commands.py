"""``aggview bench dashboard|tpcw|modes``: full benchmark runs from the command line, against a
running cluster (``--address``) or a local one started for the run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

AddSecurity = Callable[[argparse.ArgumentParser], None]
ClientOptions = Callable[[argparse.Namespace], dict[str, Any]]


def add_bench_commands(sub: Any, add_security: AddSecurity, client_options: ClientOptions) -> None:
    import importlib

    bench = sub.add_parser("bench", help="run a load generator and write its report and plots")
    kinds = bench.add_subparsers(dest="kind", required=True)
    for name, module_name, help_text in (
        (
            "dashboard",
            "loadgen.dashboard_bench",
            "dashboard events under no view, sync and async views",
        ),
        ("tpcw", "loadgen.tpcw_bench", "TPC-W-style web shop interactions"),
        ("modes", "loadgen.modes_bench", "no view, sync, async and Cumulus on one workload"),
    ):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:  # TPC-W lands in its own change
            continue
        parser = kinds.add_parser(name, help=help_text)
        module.add_arguments(parser)
        add_security(parser)
        parser.set_defaults(run=lambda args, m=module: m.run(args, client_options(args)))
