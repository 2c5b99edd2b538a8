"""aligner's version, in core so that every layer (the dump manifest header among them) can read it."""

__version__ = "0.1.0"
