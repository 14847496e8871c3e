"""The view compiler: a view's SQL -> ``ViewPlan``, its delta rules and aggregate state; M3
programs (``cumulus.m3``) and the Cumulus runtime (``cumulus.runtime``). The Spark layer is the
``aggspark`` package, above the client library."""
