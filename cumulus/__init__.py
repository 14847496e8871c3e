"""The view compiler (a view's SQL -> ``ViewPlan``, its delta rules and aggregate state) and,
in ``cumulus.spark``, the Spark layer: bulk loads, view initialization and verification."""
