"""The systems `benchmarks.compare` records the review workload with, one module each."""
