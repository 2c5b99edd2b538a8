"""`align convert --optimizer`'s notes are Words (pipelines/convert/says.py), worded by render/words/convert.py: the
evidence stays readable (which class, which arguments, which defaults) and the text is the sentence users read."""
from __future__ import annotations

from aligner.core.words import Words
from aligner.pipelines.convert import Hyper, convert_state_dicts
from aligner.pipelines.convert.says import Say
from tests.pipelines.convert.test_optimizer import _train_memory


def test_conversion_notes_carry_their_evidence_and_read_as_sentences() -> None:
    ckpt = _train_memory()  # torch.optim.Adam(lr=0.01), 2 steps
    out = convert_state_dicts({k: v.numpy() for k, v in ckpt["model"].items()}, ckpt["optimizer"], src="pytorch",
                              target="mint:Adam")
    construct = next(n for n in out.conversion.notes if isinstance(n, Words) and n.code is Say.CONSTRUCT)
    assert construct["cls"] == "mindspore.mint.optim.Adam" and construct["args"]["lr"] == 0.01
    assert construct == (f"construct mindspore.mint.optim.Adam with {construct['args']} (hyperparameters are "
                         "constructor arguments in MindSpore, not checkpoint entries)")
    back = convert_state_dicts(out.model, out.optimizer, src="mindspore", target="torch:Adam",
                               from_optimizer="mint:Adam", hyper=Hyper(lr=0.01))
    codes = {n.code: n for n in back.conversion.notes if isinstance(n, Words)}
    assert {Say.TORCH_DEFAULTS, Say.TORCH_ORDER} <= set(codes)
    # mint:Adam's checkpoint keeps no betas/eps: written as torch's defaults, and said so, names and values alike
    defaulted = codes[Say.TORCH_DEFAULTS]["names"]
    assert any(name.startswith("betas=") for name in defaulted), defaulted
    assert str(codes[Say.TORCH_DEFAULTS]).startswith("not recorded in the source, written as torch's defaults: "
                                                     + ", ".join(defaulted) + " (torch's load_state_dict")
    count = codes[Say.TORCH_ORDER]["count"]
    assert count == len(ckpt["optimizer"]["state"]) and f"must list {count} parameters" in codes[Say.TORCH_ORDER]
