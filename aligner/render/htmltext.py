"""Strings from the data made safe for the HTML pages: as page text, and as plotly labels (which plotly reads as
its own pseudo-HTML: a name holding `<a href=...>` or `<span style=...>` would otherwise render live)."""
from __future__ import annotations

import html
import re
from typing import Any

from aligner.core.text import UNPRINTABLE, printable

# what needs escaping: HTML's five specials, or a control character, bidi override or lone surrogate (most names hold
# none: a quick search skips the replaces)
_SPECIAL = re.compile(r"""[&<>"']|""" + UNPRINTABLE.pattern)


def page_text(value: Any) -> str:
    """`value` as HTML text or attribute value: specials escaped, control/bidi characters and lone surrogates shown
    as escapes (\\x1b, \\ud800), so the page reads as the data and can be written as UTF-8."""
    text = str(value)
    return html.escape(printable(text), quote=True) if _SPECIAL.search(text) else text


def plotly_text(value: Any) -> str:
    """`value` for a plotly label (trace name, hover text, title, annotation), which takes a little HTML and decodes
    &lt; &gt; &amp; (but not &quot;): shown as the data, never as a tag."""
    text = str(value)
    return html.escape(printable(text), quote=False) if _SPECIAL.search(text) else text
