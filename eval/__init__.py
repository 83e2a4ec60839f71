"""Accounting, reports, workload drivers and server control for comparing cache policies."""
