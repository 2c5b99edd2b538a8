"""Array comparison: streaming error metrics over tensor pairs (the fused C kernel) and tensor statistics. No files."""
