"""The sentences of `align diff`: its hints, and `--grads`'s update-rule comparison (codes: pipelines/diff/says.py)."""
from __future__ import annotations

from aligner.core.words import Words
from aligner.pipelines.diff.says import Say
from aligner.render.words import Template, fill, say

# a term of the update rule as the sentences name it
TERM_WORDS = {"family": "optimizer", "lr": "learning rate", "momentum": "momentum", "dampening": "dampening",
              "nesterov": "nesterov", "beta1": "beta1", "beta2": "beta2", "eps": "eps", "weight_decay": "weight decay"}


def _unclipped(w: Words) -> str:
    return "" if w["unclipped"] is None else f"; {w['unclipped']} does not clip"


def _clipped(w: Words) -> str:
    if w.code is Say.CLIPPED_EVERY:
        norms = ", ".join(f"{n:.3g}" for n in w["norms"])
        text = f"gradients clipped on {w['side']} at every step (global norms {norms}): only lr x max_norm is " \
               "identifiable"
    elif w.code is Say.CLIPPED_ASSUMED:
        text = fill("gradients clipped on {side} at every step: global norm {max_norm:.3g} if its learning rate is "
                    "{other}'s", **w.fields)
    else:
        text = fill("gradients clipped on {side} by global norm {max_norm:.3g} (step(s) {steps!j})", **w.fields)
    return text + _unclipped(w)


def _weight_decay(w: Words) -> str:
    lines = [f"{who} applies weight decay {value:.3g}" if value else f"{who} applies none"
             for who, value in w["decays"]]
    return f"weight decay on {w['what']}: " + "; ".join(lines)


def _optimizer(w: Words) -> str:
    own = "" if w["own"] is None else f": {say(w['own'])}"
    return fill("optimizer {a} {fa} vs {b} {fb} on {what}", **w.fields) + own


def _term(w: Words) -> str:
    family = w["family"] if w["family"] is not None else "optimizer"
    return fill("{family} {word} {a} {va} vs {b} {vb} on {what}", **(w.fields | {"family": family,
                                                                                "word": TERM_WORDS[w["term"]]}))


def _no_rule(w: Words) -> str:
    closest = "" if w["closest"] is None else \
        " (closest: {}, off by {:.2g} of the distance moved)".format(*w["closest"])
    return "no update rule reproduces its values from its gradients" + closest


def _bn_momentum(w: Words) -> str:
    where = "assuming they started from a fresh layer's mean 0 / variance 1 (pass --init to be sure)" \
        if w["assumed"] else "from --init"
    text = (f"BatchNorm running statistics moved {w['ratio']:.3g}x as far in A as in B ({w['tensors']} tensors, "
            f"{where}): the BatchNorm momentum differs")
    if w["swapped"]:
        text += (f"; {w['ratio']:.3g} = 0.9/0.1 means {w['swapped']}'s momentum was written in the other framework's "
                 "convention (MindSpore momentum=0.9 is torch momentum=0.1)")
    return text


def _updated_one_side(w: Words, limit: int = 6) -> str:
    names = w["names"]
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return f"updated in {w['moved']} only: {shown} (frozen in {w['still']}, or left out of {w['still']}'s optimizer)"


TEMPLATES: dict[Say, Template] = {
    Say.LOSS_SCALE: "{side}'s dumped gradients are {scale:g}x {other}'s at step 1 (a loss scale of {scale:g}); they "
                    "are divided by {scale:g} before fitting, so its rules read in unscaled units",
    Say.CLIP_BEFORE_UNSCALE: "{side} clips its gradients while they are still multiplied by the loss scale {scale:g} "
                             "(clip before unscale, checklist mp.03): the threshold acts on gradients {scale:g}x too "
                             "large, so its updates are 1/{scale:g} of the other side's",
    Say.CLIP_BEFORE_UNSCALE_FIX: "unscale the gradients before clipping (torch: scaler.unscale_(optimizer) before "
                                 "clip_grad_norm_)",
    Say.CLIPPED_EVERY: _clipped,
    Say.CLIPPED_ASSUMED: _clipped,
    Say.CLIPPED_BY: _clipped,
    Say.CLIP_BOTH_FIX: "clip on both sides with the same max_norm, or on neither",
    Say.NO_RULE_FITS: "{side} {name}: {reason}; the gradients may come from other steps than the weights, or the "
                      "optimizer is not SGD/Adam/AdamW",
    Say.NO_RULE_FITS_FIX: "dump the gradients of the same steps the checkpoints cover",
    Say.LOSS_SCALE_NOT_REMOVED: "{side} did not remove the loss scale before the update: its updates are {scale:g}x "
                                "the other side's on {what}",
    Say.LOSS_SCALE_NOT_REMOVED_FIX: "unscale gradients before optimizer.step (torch.amp GradScaler.step / MindSpore "
                                    "DynamicLossScaleManager or loss_scale= in the optimizer)",
    Say.UPDATE_LR: "learning rate {ratio:.3g}x: {a} {va} vs {b} {vb} on {what}",
    Say.SAME_LR_FIX: "use the same learning rate and schedule",
    Say.WEIGHT_DECAY: _weight_decay,
    Say.WEIGHT_DECAY_FIX: "group the parameters the same way on both sides (MindSpore skips only names with "
                          "'beta'/'gamma' by default, so biases get weight decay; torch decays every parameter of a "
                          "group)",
    Say.OPTIMIZER: _optimizer,
    Say.OWN_FORMULA: lambda w: f"{w['family']} " + fill(w["why"], ratio=w["ratio"], beta1=w["beta1"],
                                                         beta2=w["beta2"]),
    Say.OPTIMIZER_FIX: "use mindspore.mint.optim.AdamW / Adam (torch's formulas) or the matching torch optimizer",
    Say.UNEXPLAINED: "{a}'s rule ({rule}) does not reproduce {b}'s values on {what} although every fitted setting "
                     "agrees within what {steps} steps resolve",
    Say.UNEXPLAINED_FIX: "dump more steps (or params=True) to resolve the settings",
    Say.TERM: _term,
    Say.SAME_TERM_FIX: lambda w: f"set the same {TERM_WORDS[w['term']]} on both sides",
    Say.TOO_FEW_VALUES: "too few values ({values}) to fit an update rule alone, and no rule of a larger parameter fits "
                        "it",
    Say.NO_RULE_REPRODUCES: _no_rule,
    Say.BN_MOMENTUM: _bn_momentum,
    Say.BN_MOMENTUM_FIX: "MindSpore BatchNorm momentum = 1 - torch momentum: use momentum=0.9 in MindSpore for torch's "
                         "default 0.1",
    Say.LR_RATIO: "every updated parameter moved {ratio:.4g}x as far in A as in B ({count} parameters): the learning "
                  "rate differs (A's is {ratio:.4g} x B's), or the loss or gradients are scaled",
    Say.LR_RATIO_FIX: "compare the optimizers' learning rates and schedules, loss scaling and gradient accumulation",
    Say.UPDATED_ONE_SIDE: _updated_one_side,
    Say.ONE_SIDE_FIX: "check requires_grad and the parameter list given to {still}'s optimizer",
}
