"""The coordinator: a member's coordinating side (catalog, clock, two-phase commit, views,
failover). The Python client is the ``aggclient`` package, which does not import this one."""
