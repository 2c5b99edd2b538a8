"""Presentation: the only place that formats output (terminal tables, text verdicts, JSON, CSV, HTML, plots)."""
