"""Rules as data. This top-level folder is installed as the package `aligner.mappings` (see setup.py)."""
