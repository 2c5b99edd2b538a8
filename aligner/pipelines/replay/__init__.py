"""Replay: each module's own error on the reference's inputs, next to the error it inherited (see replay/run.py)."""
