"""Load generators (transfers, TPC-W, the thesis's dashboard), their benchmarks, and the demo
(``aggview demo``) that runs them."""
