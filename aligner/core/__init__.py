"""The core every layer may use: errors and exit codes, dtypes, tolerances, findings, atomic writes, progress."""
