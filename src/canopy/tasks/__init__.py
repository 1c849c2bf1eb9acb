"""Benchmark task readers shared by the applications (no application imports another):
:mod:`canopy.tasks.bbh` (BIG-Bench Hard few-shot prompts, items and grading)."""
