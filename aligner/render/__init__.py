"""Presentation: the only place that formats output (terminal tables, text verdicts, JSON, CSV, HTML, plots).

The names below are imported on first use: `align compare` writes an HTML report only with --html and a rank table
only for multi-rank dumps, so it loads neither module (nor the pipelines they present) otherwise.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aligner.core import lazy

if TYPE_CHECKING:
    from aligner.render.html import FullTable, write_html
    from aligner.render.html_profile import ErrorProfile, Tee
    from aligner.render.ranks import print_ranks, write_ranks_json
    from aligner.render.ranks import summary as ranks_summary

# public name -> (module, its name there)
_LAZY = {"write_html": ("aligner.render.html", "write_html"),
         "FullTable": ("aligner.render.html", "FullTable"),
         "ErrorProfile": ("aligner.render.html_profile", "ErrorProfile"),
         "Tee": ("aligner.render.html_profile", "Tee"),
         "print_ranks": ("aligner.render.ranks", "print_ranks"),
         "ranks_summary": ("aligner.render.ranks", "summary"),
         "write_ranks_json": ("aligner.render.ranks", "write_ranks_json")}

__all__ = ["ErrorProfile", "FullTable", "Tee", "print_ranks", "ranks_summary", "write_html", "write_ranks_json"]


__getattr__ = lazy.attributes(__name__, _LAZY)
