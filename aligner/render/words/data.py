"""The parts of `align data compare`'s sentences that depend on what was recorded (codes: pipelines/data/says.py);
the rules' own templates are in mappings/data_rules.yaml, filled by render/data.py."""
from __future__ import annotations

from aligner.pipelines.data.says import Say
from aligner.render.words import Template

TEMPLATES: dict[Say, Template] = {
    Say.REREADS_ORDER: "; each side reads its order again in its second epoch",
    Say.ONE_EPOCH_ORDER: "; one epoch recorded: record_data(..., epochs=2) tells a shuffle from a fixed order",
    Say.RANDOM_BOTH: " on both sides",
    Say.RANDOM_ON: " on side {side}",
    Say.RANDOM_UNKNOWN: " on one side (one epoch recorded: record epochs=2 to tell which side, and a random transform "
                        "from a coarse resampling)",
}
