"""How a call and a module's settings are written (aligner.dumping.signature): every plain value comes back from the
JSON as it was passed (tuples as tuples, non-finite floats, numpy scalars as numbers), and anything else is opaque."""
from __future__ import annotations

import collections
import enum
import json
import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aligner.dumping.signature import attributes, describe, restore, scalar

_LEAVES = st.one_of(st.none(), st.booleans(), st.booleans().map(np.bool_), st.integers(-(1 << 70), 1 << 70),
                    st.text(max_size=4), st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(-1000, 1000).map(np.int64), st.floats(-1e3, 1e3).map(np.float32))
_VALUES = st.recursive(_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.lists(inner, max_size=3).map(tuple)), max_leaves=8)


def _same(a: object, b: object) -> bool:
    """Equal as a replay would pass it: the same container types, NaN equal to NaN, numpy scalars as Python's."""
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (float, np.floating)):
        return isinstance(b, float) and (b == float(a) or (math.isnan(b) and math.isnan(float(a))))
    if isinstance(a, np.integer):
        return type(b) is int and b == int(a)
    if isinstance(a, np.bool_):
        return type(b) is bool and b == bool(a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(args=st.lists(_VALUES, max_size=3), kwargs=st.dictionaries(st.text(max_size=3), _VALUES, max_size=2))
def test_plain_values_come_back_from_the_json_as_they_were_passed(args: list, kwargs: dict) -> None:
    structure, places = describe(tuple(args), kwargs)
    assert places == []
    line = json.dumps(structure, allow_nan=False)  # no bare NaN or Infinity: tagged
    back_args, back_kwargs = restore(json.loads(line), [])
    assert _same(list(args), back_args)
    assert back_kwargs.keys() == kwargs.keys() and all(_same(kwargs[k], back_kwargs[k]) for k in kwargs)


class _Mode(enum.IntEnum):
    SUM = 2


_Pair = collections.namedtuple("_Pair", "a b")


def test_subclasses_of_plain_types_are_written_as_their_values() -> None:
    assert scalar(_Mode.SUM) == 2 and type(scalar(_Mode.SUM)) is int
    assert scalar(_Pair(1, 2.5)) == {"tuple": [1, 2.5]}
    assert scalar(np.str_("same")) == "same"
    assert scalar(True) is True and scalar([np.bool_(True)]) == [True]  # numpy's bool: a bool (was opaque)


def test_a_module_attribute_holding_a_tensor_or_an_object_is_left_out() -> None:
    layer = torch.nn.Linear(2, 3)
    layer.pair = (torch.zeros(1), 2)  # a tensor inside a tuple
    layer.init = object()
    layer.sizes = (3, (4, 5))
    layer.bad = float("-inf")
    attrs = attributes(layer)
    assert "pair" not in attrs and "init" not in attrs
    assert attrs["sizes"] == {"tuple": [3, {"tuple": [4, 5]}]} and attrs["bad"] == {"float": "-inf"}
    assert attrs["in_features"] == 2 and attrs["class"] == "torch.nn.modules.linear.Linear"


class _NoRepr:
    """A value whose repr must not be asked for (a model config's repr serialises the whole config)."""

    def __repr__(self) -> str:
        raise AssertionError("repr of an attribute that is left out")


class _Opaque(enum.Enum):
    OBJECT = _NoRepr()


def test_an_attribute_left_out_is_never_written_out_first() -> None:
    layer = torch.nn.Linear(2, 3)
    layer.config = _NoRepr()
    layer.mode = _Opaque.OBJECT  # an enum whose value JSON cannot hold: left out as its value would be
    layer.items = [1, _NoRepr()][:1]
    attrs = attributes(layer)
    assert "config" not in attrs and "mode" not in attrs and attrs["items"] == [1]


def test_a_mindspore_cell_records_its_operators_settings_but_dtypes_and_objects() -> None:
    import mindspore as ms

    cell = ms.nn.LayerNorm((4,), epsilon=1e-5)
    cell.layer_norm.add_prim_attr("note", _NoRepr())  # an operator setting JSON cannot hold: left out, unwritten
    cell.layer_norm.add_prim_attr("to", ms.float16)
    cell.cast = ms.ops.Cast()  # settings of plain values only (its input and output names)
    attrs = attributes(cell)
    assert attrs["layer_norm"] == {"dict": {"begin_norm_axis": -1, "begin_params_axis": -1, "epsilon": 1e-5}}
    assert attrs["cast"] == {"dict": {"input_names": ["x", "dst_type"], "output_names": ["output"]}}
    assert attrs["epsilon"] == 1e-5 and attrs["class"] == "mindspore.nn.layer.normalization.LayerNorm"
