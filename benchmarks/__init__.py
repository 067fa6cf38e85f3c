"""fpipe's benchmark workloads (see ``../shared/BENCHMARKS.md``); run ``python -m benchmarks``."""
