"""A sentence as data. A pipeline says what it found as `Words`: a code (a member of its own Enum) and the names,
numbers and settings the sentence is about. aligner/render/words/ holds one template per code and writes the
sentence, for the terminal, the HTML page and the JSON's `message` fields alike; no pipeline writes prose.

Words are also the sentence itself: a `str` whose text render/ wrote when they were made (render/words registers its
writer with `speak_with` when `import aligner` runs, before any pipeline can make Words). So a library user prints a
result's `message`, puts it in an f-string, or `json.dumps` a result's `to_dict()` as with any text, while the code
and data stay readable (`words.code`, `words["module"]`). A result read back from a saved JSON holds the plain `str`.
"""
from __future__ import annotations

import enum
from typing import Any, Callable, Union

_speaker: Callable[[Words], str] | None = None


def speak_with(write: Callable[[Words], str]) -> None:
    """Register how Words become text (aligner/render/words registers its template filler; core imports no render)."""
    global _speaker
    _speaker = write


class Words(str):
    """What to say (`code`, worded by render/) and what it is about (`data`: name -> value, in order), and as a `str`
    the sentence render/ wrote for them. Immutable; equal to other Words with the same code and data, and to the
    plain text of the sentence (what a saved result holds)."""

    code: enum.Enum
    data: tuple[tuple[str, Any], ...]

    def __new__(cls, code: enum.Enum, data: tuple[tuple[str, Any], ...] = ()) -> Words:
        data = tuple(data)
        text = ""
        if _speaker is not None:
            blank = str.__new__(cls, "")
            object.__setattr__(blank, "code", code)
            object.__setattr__(blank, "data", data)
            text = _speaker(blank)
        else:  # only if render/words could not be imported: the evidence, never a crash
            text = f"{code.name}: " + ", ".join(f"{k}={v!r}" for k, v in data)
        self = str.__new__(cls, text)
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "data", data)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Words are immutable")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Words):
            return (self.code, self.data) == (other.code, other.data)
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__   # equal Words have equal text; Words equal to a text hash like it

    def __repr__(self) -> str:
        return f"Words({self.code}, {self.data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Words, (self.code, self.data))

    def __deepcopy__(self, memo: dict[int, Any]) -> Words:
        return self   # immutable

    def __copy__(self) -> Words:
        return self

    @property
    def fields(self) -> dict[str, Any]:
        """The data as a dict (the template's keyword arguments)."""
        return dict(self.data)

    def __getitem__(self, key: Any) -> Any:
        """A datum by its name; an index or a slice reads the text, as of any str."""
        return self.fields[key] if isinstance(key, str) else str.__getitem__(self, key)

    def without(self, *keys: str) -> Words:
        """The same words without some of their data (a template that finds a key missing leaves its part out)."""
        return Words(self.code, tuple((k, v) for k, v in self.data if k not in keys))


def words(code: enum.Enum, **data: Any) -> Words:
    """`Words(code, data)` with the data as keyword arguments."""
    return Words(code, tuple(data.items()))


Text = Union[str, Words]   # a sentence: Words made by a pipeline, or the text read back from a saved result
