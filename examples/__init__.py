"""Runnable example pipelines; `stagetrail demo` records them."""
