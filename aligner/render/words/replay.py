"""Why `align replay` did not replay a call (aligner/pipelines/replay/says.py names each code)."""
from __future__ import annotations

from aligner.pipelines.replay.says import Say
from aligner.render.words import Template

TEMPLATES: dict[Say, Template] = {
    Say.UNPAIRED_INPUTS: "the calls take different tensors (reference {reference}, replayed side {other}) that their "
                         "shapes do not pair",
    Say.INPUT_UNREADABLE: "the reference's input {index} could not be read",
    Say.FORWARD_RAISED: "calling it on the reference's inputs raised {error}",
    Say.OUTPUT_UNREADABLE: "the reference's recorded output could not be read",
    Say.NO_OUTPUT_PAIRS: "no output pairs with a recorded reference output",
    Say.CALLED_TWICE: "called more than once in the step: its gradients cannot be told apart by call",
    Say.BACKWARD_RAISED: "pulling gradients back through it raised {error}",
    Say.NO_GRADIENT_PAIRS: "no input gradient pairs with a recorded reference gradient",
}
