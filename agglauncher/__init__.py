"""The process launcher: ``LocalCluster``, a cluster of real member processes over one data
directory (``aggview start``, the demo and benchmarks, the tests). Imports only ``aggview``."""
