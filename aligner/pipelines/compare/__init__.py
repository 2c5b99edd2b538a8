"""`align compare`: read two dumps, pair their records, compute metrics and find the first divergence."""
