"""render/words: a pipeline's `Words` become one sentence, the same on the terminal and in the JSON, and a sentence
read back from a saved result is shown as it was saved."""
from __future__ import annotations

import copy
import json
import pickle

import pytest

from aligner.core.words import Words, words
from aligner.pipelines.audit.says import Say as AuditSay
from aligner.pipelines.compare.says import Say as CompareSay
from aligner.render.jsonout import dumps
from aligner.render.words import say


def test_words_are_their_sentence_for_a_library_user() -> None:
    """Words are a str holding render's sentence: printed, formatted, json.dumps'ed and sliced as text, equal to the
    saved text, and still the evidence (code, data); pickled and copied whole."""
    said = words(AuditSay.DTYPE, torch="float32", ms="float16")
    sentence = "computes in torch float32 vs MindSpore float16"
    assert say(said) == str(said) == f"{said}" == sentence and type(say(said)) is str
    assert json.loads(json.dumps({"message": said})) == {"message": sentence}
    assert said == sentence and hash(said) == hash(sentence) and said[:8] == "computes"
    assert said.code is AuditSay.DTYPE and said["torch"] == "float32"
    assert pickle.loads(pickle.dumps(said)) == said and copy.deepcopy(said) is said
    with pytest.raises(AttributeError):
        said.code = AuditSay.SIZE_ONE  # type: ignore[misc]


def test_templates_fill_conversions_and_nested_words() -> None:
    sizes = words(AuditSay.SIZE_ONE, size=(8, 8))
    padding = words(AuditSay.PADDING, torch=((1, 1), (1, 1)), ms=((0, 1), (0, 1)), sizes=sizes)
    layer = words(AuditSay.LAYER, where=("maxpool", "max_pool"), kind="MaxPool", said=padding, why="")
    assert say(layer) == ("maxpool / max_pool (MaxPool): padding (before, after) per axis torch (1, 1) x (1, 1) vs "
                          "MindSpore (0, 1) x (0, 1) for its input size 8x8")
    # a group's words are the same without the paths
    assert say(layer.without("where")).startswith("(MaxPool): padding")
    setting = words(AuditSay.SETTING, attribute="eps", torch=1e-05, ms=1e-07, meaning=(), defaults=(
        ("MindSpore", 1e-07, "nn.LayerNorm"),))
    assert say(setting) == "eps torch 1e-05 vs MindSpore 1e-07; MindSpore 1e-07 is nn.LayerNorm's default"


def test_a_saved_sentence_is_shown_as_saved() -> None:
    assert say("text read back from a saved report") == "text read back from a saved report"


def test_json_writes_the_sentence_where_the_result_holds_words() -> None:
    reason = words(CompareSay.AFTER_FORWARD, reason=words(CompareSay.CARRIED, module="", e_in=0.03125))
    text = dumps({"reason": reason, "saved": "as it was"})
    assert json.loads(text) == {"reason": "carried from (root) (input error 3.1e-02); the forward pass had already "
                                          "diverged, so the backward one follows from it", "saved": "as it was"}


def test_words_compare_by_their_evidence() -> None:
    a = Words(AuditSay.OPT_ALL, (("count", 10),))
    assert a == words(AuditSay.OPT_ALL, count=10) and a != words(AuditSay.OPT_ALL, count=11)
    assert a["count"] == 10 and a.fields == {"count": 10}
