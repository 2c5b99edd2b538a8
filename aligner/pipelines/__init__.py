"""Pipelines: each runs one job (convert, diff, compare, losses, ...) and returns a typed result object."""
