"""A sentence as data. A pipeline says what it found as `Words`: a code (a member of its own Enum) and the names,
numbers and settings the sentence is about. aligner/render/words/ holds one template per code and writes the
sentence, for the terminal, the HTML page and the JSON's `message` fields alike; no pipeline writes prose.

A result read back from a saved JSON holds the sentence itself (a `str`): `Text` is either, and render/ shows a
`str` as it is. Words refuse to be formatted directly (`str(words)` raises), so a sentence that skipped render/
fails loudly instead of printing a repr. They are no dataclass, so `dataclasses.asdict` of a result keeps them whole.
"""
from __future__ import annotations

import enum
from typing import Any, Union


class Words:
    """What to say (`code`, worded by render/) and what it is about (`data`: name -> value, in order). Immutable."""

    __slots__ = ("code", "data")
    code: enum.Enum
    data: tuple[tuple[str, Any], ...]

    def __init__(self, code: enum.Enum, data: tuple[tuple[str, Any], ...] = ()) -> None:
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "data", tuple(data))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Words are immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Words) and (self.code, self.data) == (other.code, other.data)

    def __hash__(self) -> int:
        return hash((self.code, self.data))

    def __repr__(self) -> str:
        return f"Words({self.code}, {self.data!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> Words:
        return self   # immutable

    @property
    def fields(self) -> dict[str, Any]:
        """The data as a dict (the template's keyword arguments)."""
        return dict(self.data)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def without(self, *keys: str) -> Words:
        """The same words without some of their data (a template that finds a key missing leaves its part out)."""
        return Words(self.code, tuple((k, v) for k, v in self.data if k not in keys))

    def __str__(self) -> str:
        raise TypeError(f"Words({self.code}) are worded by aligner.render.words.say, not str()")

    def __format__(self, spec: str) -> str:
        raise TypeError(f"Words({self.code}) are worded by aligner.render.words.say, not format()")


def words(code: enum.Enum, **data: Any) -> Words:
    """`Words(code, data)` with the data as keyword arguments."""
    return Words(code, tuple(data.items()))


Text = Union[str, Words]   # a sentence: to be worded by render/ (Words), or read back from a saved result (str)
