"""What `align data compare` adds to a rule's evidence as a part of its sentence, as codes: `Words(Say.X, data)`
(the rule's own templates are in mappings/data_rules.yaml), and aligner/render/words/data.py holds each part."""
from __future__ import annotations

import enum


class Say(enum.Enum):
    """One part of a data finding's sentence that depends on what was recorded (the data each takes: its template)."""

    # order-differs: why the order cannot be a shuffle (its `note`)
    REREADS_ORDER = "rereads_order"          # each side reads its order again in its second epoch
    ONE_EPOCH_ORDER = "one_epoch_order"      # one epoch recorded: a shuffle cannot be told from a fixed order
    # augmentation: where the random transform is active (its `active`)
    RANDOM_BOTH = "random_both"
    RANDOM_ON = "random_on"                  # side: the dump whose two epochs differ
    RANDOM_UNKNOWN = "random_unknown"        # one epoch recorded: which side cannot be told
