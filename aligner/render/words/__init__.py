"""Every sentence a pipeline's evidence becomes: `say(words)` looks up the template of `words.code` and fills it.

A template is a `str.format` string over the words' data, with three conversions of our own: `!l` writes a value as
code (core.text.code_literal: 0.1, (1, 2)), `!x` a shape as 1x3x8x8, `!j` a sequence as 'a, b'; a nested `Words`
value is its sentence (Words were worded when made). Where the sentence depends on the data beyond filling it in (a
plural, a part said only sometimes), the template is a function of the words. One module per pipeline holds its
codes' templates (`TEMPLATES`); tests/test_architecture.py checks every code has one.
"""
from __future__ import annotations

import enum
import functools
import importlib
import string
from typing import Any, Callable, Mapping, Union

from aligner.core.text import code_literal
from aligner.core.words import Text, Words, speak_with

Template = Union[str, Callable[[Words], str]]
# aligner/render/words/<module>.py, each with TEMPLATES
MODULES = ("audit", "check", "compare", "convert", "data", "diff", "replay")


class _Formatter(string.Formatter):
    """str.format with !l (code literal), !x (a shape) and !j (joined by ', ')."""

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion == "l":
            return code_literal(value)
        if conversion == "x":
            return "x".join(map(str, value))
        if conversion == "j":
            return ", ".join(map(str, value))
        return super().convert_field(value, conversion)


_FORMATTER = _Formatter()


@functools.cache
def templates() -> Mapping[enum.Enum, Template]:
    """Every code's template, from the modules in MODULES."""
    out: dict[enum.Enum, Template] = {}
    for name in MODULES:
        out.update(importlib.import_module(f"{__name__}.{name}").TEMPLATES)
    return out


def fill(template: str, **data: Any) -> str:
    """`template` filled with `data` (the conversions above); for templates that build a sentence from parts."""
    return _FORMATTER.vformat(template, (), data)


def _write(words: Words) -> str:
    """The template of `words.code` filled with its data: how Words get their text (registered with core below)."""
    template = templates()[words.code]
    return template(words) if callable(template) else _FORMATTER.vformat(template, (), words.fields)


def say(text: Text) -> str:
    """The sentence as plain text: Words carry theirs (written by `_write` when they were made), a saved one is it."""
    return str(text)


speak_with(_write)
