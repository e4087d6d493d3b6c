"""Corpora: a source cut into partitions, one per-batch function, an executor (in-process or Ray Data), a sink of
Parquet shards that the same command resumes (DESIGN.md, "Corpora"). Neither the function nor the sink knows the
executor. pyarrow and Ray are imported only here, and only when a corpus is run (the ``scale`` extra)."""
