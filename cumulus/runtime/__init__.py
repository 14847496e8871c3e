"""The Cumulus runtime: an M3 program's maps partitioned over DW nodes, updates dispatched by
switches, executed speculatively and repaired by corrective updates (seeds 000, 001, 003 §5)."""
