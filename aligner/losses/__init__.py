"""Loss-curve comparison: read training logs, compare them step by step, diagnose where they part."""
