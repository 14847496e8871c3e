"""Load generators: the transfer workload now; TPC-W and the dashboard benchmark later."""
