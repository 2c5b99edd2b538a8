"""A port dumped through a wrapper cell: MindSpore's TrainOneStepCell(WithLossCell(net)) records every path under
`network._backbone.`, DDP's wrapper under `module.`, a user's training shell under `net.`, while the reference was
dumped bare. On real zoo pairs (timm ViT vs mindcv, transformers BERT vs mindone) with one bug injected, `align
compare` must still pair the records by name and name the layer with the bug.

Skipped when the zoo is not installed (scripts/install_zoo.sh)."""
from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")
from tests.zoo import torch_compat  # noqa: F401  (must precede timm/transformers: torchvision op schemas)

for _name in ("timm", "mindcv", "transformers", "mindone.transformers"):
    pytest.importorskip(_name)

import mindspore as ms  # noqa: E402

from tests.zoo import localization as loc  # noqa: E402


class _Shell(ms.nn.Cell):
    """A training shell holding the network under `attribute` (nested by dots), calling it as it is."""

    def __init__(self, net: Any, attribute: str) -> None:
        super().__init__()
        head, _, rest = attribute.partition(".")
        setattr(self, head, _Shell(net, rest) if rest else net)
        self.inner = head

    def construct(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, self.inner)(*args, **kwargs)


@pytest.mark.parametrize(("bug_id", "wrapper"), [("vit-gelu-tanh", "network._backbone"),
                                                 ("bert-transposed-weight", "module")])
def test_a_wrapped_port_pairs_by_name_and_names_the_bug(pair_runs, bug_id: str, wrapper: str) -> None:
    bug = next(b for b in loc.CATALOGUE if b.id == bug_id)
    run = pair_runs(bug.family)
    reference = run.reference("base")
    net = run.pair.ms_model
    restore = bug.inject(run.pair)
    try:
        run.pair.ms_model = _Shell(net, wrapper)
        ms_dir = run.dump_ms(run.fresh(f"wrapped_{bug_id}"))
    finally:
        run.pair.ms_model = net
        restore()
    result = loc.compare(ms_dir, reference)
    ported = [r.pair.a.record.module for r in result.rows if r.pair.a is not None and r.pair.a.record.parent]
    # the prefix is really there (the wrapper's own `block` record names the wrapper itself)
    assert ported and all(m == wrapper or m.startswith(wrapper + ".") for m in ported)
    counts = result.matched
    # without the prefix stripped no record pairs by name (every one then goes through the content alignment); with
    # it the port's records pair by name as they do unwrapped (a handful of MindSpore-only calls are content-paired)
    assert counts["name"] > 10 * counts["content"], counts
    assert [f.blame for f in result.verdict.findings[:1]] == [bug.expected]
