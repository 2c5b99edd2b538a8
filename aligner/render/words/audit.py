"""The audit's sentences (aligner/pipelines/audit/says.py names each code and the data it takes)."""
from __future__ import annotations

from typing import Any

from aligner.core.text import code_literal
from aligner.core.words import Words
from aligner.pipelines.audit.says import Say
from aligner.render.words import Template, fill, say

_PROBE_INPUT = "(standard normal x 3, same parameters)"


def _where(w: Words) -> str:
    """'torch path / MindSpore path ' of a finding at a pair (<top> for the model itself); '' in a group's words."""
    if "where" not in w.fields:
        return ""
    torch_path, ms_path = w["where"]
    return f"{torch_path or '<top>'} / {ms_path or '<top>'} "


def _layer(w: Words) -> str:
    return _where(w) + fill("({kind}): {said}", **w.fields) + (f"; {w['why']}" if w["why"] else "")


def _setting(w: Words) -> str:
    meaning = "".join(f" (torch's meaning: {code_literal(v)})" for v in w["meaning"])
    defaults = "".join(f"; {side} {code_literal(value)} is {cls}'s default" for side, value, cls in w["defaults"])
    return fill("{attribute} torch {torch!l} vs MindSpore {ms!l}", **w.fields) + meaning + defaults


def _pads(pads: Any) -> str:
    return " x ".join(f"({b}, {a})" for b, a in pads)


def _size_some(w: Words) -> str:
    which = {0: "even input sizes", 1: "odd input sizes"}.get(w["parity"]) or fill("some input sizes (e.g. {size!x})",
                                                                                 **w.fields)
    return fill("for {which} (e.g. {size!x}); it depends on the input size, pass example inputs to decide",
                which=which, size=w["size"])


def _law(w: Words) -> str:
    return w["name"] if w["constant"] else fill("{name}, std {std:.3g}, n={n}", **w.fields)


def _unpaired(w: Words) -> str:
    call = "" if w["call"] is None else " (call {} of {})".format(*w["call"])
    return f"unpaired{call}: no layer of its kind on the other side at its place"


def _both_lists(w: Words) -> str:
    return f"(torch {list(w['torch'])}, MindSpore {list(w['ms'])})"


def _none_ran(w: Words) -> str:
    return "no input shape ran on both (" + "; ".join(f"{list(shape)}: {error}" for shape, error in w["failures"]) + ")"


def _sharing(w: Words) -> str:
    return (f"{w['side']} shares one parameter between {' and '.join(w['shared'])}; {w['other']} has "
            f"{len(w['separate'])} separate ones ({', '.join(w['separate'])}): equal after a conversion, they train "
            "apart from the second step (each gets only its own gradient)")


def _opt_setting(w: Words) -> str:
    return fill("{head}: {label} torch {torch!l} vs MindSpore {ms!l} for {names}", **w.fields) + \
        "".join(f"; {why}" for why in w["why"])


def _opt_formula(w: Words) -> str:
    return fill("{head}: the update formulas differ for {names}: torch {torch} vs MindSpore {ms}; ", **w.fields) + \
        fill(w["why"], ratio=w["ratio"], eps_factor=w["eps_factor"])


def _opt_not_optimized(w: Words) -> str:
    one = w["count"] == 1
    return say(w["head"]) + ": " + fill(w["why"], names=w["names"], verb="is" if one else "are", side=w["side"],
                                        them="it" if one else "them")


def _opt_group(w: Words) -> str:
    names = ", ".join(w["names"][:8]) + (" ..." if len(w["names"]) > 8 else "")
    cls, value = w["cls"], code_literal(w.fields.get("value"))
    if w.code is Say.OPT_GROUP_NO_DECAY_FIX:
        return (f"group the parameters: {cls}([{{'params': decay}}, {{'params': no_decay, 'weight_decay': {value}}}], "
                f"..., weight_decay=...) with no_decay = [{names}]")
    if w.code is Say.OPT_GROUP_DECAY_FIX:
        return (f"group the parameters: {cls}([{{'params': [{names}], 'weight_decay': {value}}}, "
                "{'params': rest}], ...)")
    text = w["assignment"]
    return f"a parameter group for [{names}] with {text}: {cls}([{{'params': [...], {text}}}, ...], ...)"


def _opt_rates_from(w: Words) -> str:
    return f"torch's rates from step {w['step']}: {', '.join(code_literal(v) for v in w['rates'])}, ..."


def _source_default(w: Words) -> str:
    also = "" if w["also"] is None else " (= {}({}={!r}))".format(*w["also"])
    return fill("{argument} defaults to {default!r}", **w.fields) + also + \
        fill(" in MindSpore, {torch_api} has {torch_argument}={torch_default!r}", **w.fields)


def _same(w: Words) -> str:
    spelled = "pad_mode='same' (the default)" if w["by_default"] else "pad_mode='same'"
    if w.code is Say.SAME_KERNEL_LE_STRIDE:
        return (f"{spelled} with kernel <= stride taken as the torch reference's padding=0: equal where the input "
                "size divides by the stride (it pads nothing there)")
    same = "padding='same'" if w["padding"] is None else f"padding={w['padding']} or padding='same'"
    return f"{spelled} at stride 1 taken as the torch reference's {same} (equal); if the reference pads 0, write " \
        "pad_mode='valid'"


TEMPLATES: dict[Say, Template] = {
    Say.LAYER: _layer,
    Say.SETTING: _setting,
    Say.PADDING: lambda w: (f"padding (before, after) per axis torch {_pads(w['torch'])} vs MindSpore "
                            f"{_pads(w['ms'])} {say(w['sizes'])}"),
    Say.CEIL_MODE: "ceil_mode torch {torch} vs MindSpore {ms}: output size torch {torch_out!x} vs MindSpore "
                   "{ms_out!x} {sizes}",
    Say.COUNT_INCLUDE_PAD: "count_include_pad torch {torch} vs MindSpore {ms}, and the windows are padded {sizes}",
    Say.DTYPE: "computes in torch {torch} vs MindSpore {ms}",
    Say.SIZE_ONE: "for its input size {size!x}",
    Say.SIZE_EVERY: "for every input size",
    Say.SIZE_SOME: _size_some,
    Say.PAD_FIX_MS: "ops.pad(x, {pads}, value={value}) before {cls}, then pad_mode='valid'",
    Say.PAD_FIX_TORCH: "F.pad(x, {pads}, value={fill}) before {cls}, then padding=0 (timm: Conv2dSame / "
                       "MaxPool2dSame pad TF-style)",
    Say.INIT_LAW: lambda w: _where(w) + fill("{migrated} {name} ~ {law}; {reference} ~ {ref_law}", **w.fields),
    Say.INIT_LAW_GROUP: "{own}: {migrated} ~ {law}; {reference} ~ {ref_law}",
    Say.LAW: _law,
    Say.INIT_FIX: "initialise {name} with mean {mean:.3g}, std {std:.3g}",
    Say.INIT_FIX_EACH: lambda w: f"{w['line'].format(param='P', shape='P.shape')} for each P",
    Say.INIT_FIX_EACH_DEFAULT: "initialise each with the reference's mean and std",
    Say.PROBE: lambda w: _where(w) + fill("({kind}): outputs differ by up to {max_diff:.2g} on one {shape!x} input "
                                          f"{_PROBE_INPUT}; {{torch_class}} vs {{ms_class}}", **w.fields),
    Say.PROBE_GROUP: f"({{kind}}): outputs differ on one input {_PROBE_INPUT}; {{torch_class}} vs {{ms_class}}",
    Say.PROBE_FIX: "{fix} (reproduces the reference's outputs on the probe)",
    Say.PROBE_NO_FIX: "make the {migrated} layer compute what the reference's does (no framework layer tried did)",
    Say.PROBE_EQUAL: "outputs equal within {atol:.0e} + {rtol:.0e} x |torch| (max {max_diff:.2g})",
    Say.PROBE_DIFFERS: "outputs differ (max {max_diff:.2g})",
    Say.NOT_PROBED: "not probed: {why}",
    Say.SHAPES_DIFFER: lambda w: f"the traced input shapes differ {_both_lists(w)}",
    Say.PARAMS_DIFFER: lambda w: f"their parameters differ {_both_lists(w)}",
    Say.PARAM_SHAPES_DIFFER: "their parameter shapes differ",
    Say.NONE_RAN: _none_ran,
    Say.SHARING: _sharing,
    Say.TIE_FIX: "tie them: {one} is the one Parameter of {others!j} as well",
    Say.UNTIE_FIX: "untie them: give {others!j} a parameter of its own (a copy of {one})",
    Say.UNPAIRED: _unpaired,
    Say.NO_INPUTS: "no example inputs: padding that depends on the input size is a warning",
    Say.ONE_OPTIMIZER: "an optimizer was given for one side only: the optimizers were not compared",
    Say.OPT_HEAD: "optimizer ({torch} / {ms})",
    Say.OPT_ALL: "all {count} parameters",
    Say.OPT_SETTING: _opt_setting,
    Say.OPT_FORMULA: _opt_formula,
    Say.OPT_FORMULA_FIX_TORCH: "use {cls} with the same settings (torch has no update without bias correction)",
    Say.OPT_NO_ARGUMENT_FIX: "{cls} has no {attribute} argument: {twin}(..., {assignment})",
    Say.OPT_GROUP_FIX: _opt_group,
    Say.OPT_GROUP_NO_DECAY_FIX: _opt_group,
    Say.OPT_GROUP_DECAY_FIX: _opt_group,
    Say.OPT_NOT_OPTIMIZED: _opt_not_optimized,
    Say.OPT_ADD_FIX: "add them to the {side} optimizer",
    Say.OPT_LEAVE_OUT_FIX: "leave them out of the {side} optimizer (or freeze them on the other side)",
    Say.OPT_LOSS_SCALE: "{head}: MindSpore loss_scale {scale!l}; {why}",
    Say.OPT_LOSS_SCALE_FIX: "{cls}(..., loss_scale=1.0) unless the loss is multiplied by {scale!l}",
    Say.OPT_GRAD_CENTRALIZATION: "{head}: MindSpore grad_centralization on {names!j}; {why}",
    Say.OPT_GRAD_CENTRALIZATION_FIX: "drop 'grad_centralization' from the parameter groups",
    Say.OPT_SCHEDULER_IGNORED: "{head}: the MindSpore scheduler {scheduler} has no effect; {why}",
    Say.OPT_LR_SHORT: "{head}: the MindSpore {source} ends at step {last} of the {steps} audited for {names}; {why}",
    Say.OPT_LR_SHORT_FIX: "give one rate per training step",
    Say.OPT_LR: "{head}: lr torch {torch!l} vs MindSpore {ms!l} for {names}",
    Say.OPT_LR_SCHEDULE: "{head}: learning rate at step {step} torch {torch!l} vs MindSpore {ms!l} for {names} "
                         "(torch {torch_source}, MindSpore {ms_source}); {detail}",
    Say.OPT_SHIFTED: "the MindSpore schedule is the torch schedule shifted by one step: MindSpore's step t uses "
                     "torch's rate of step t+1 (torch steps the scheduler after the optimizer: step 0 uses the base "
                     "lr, {base!l})",
    Say.OPT_SHIFTED_FIX_MS: "evaluate the MindSpore schedule one step later: lr_list = [base_lr] + lr_list[:-1]",
    Say.OPT_SHIFTED_FIX_TORCH: "step the torch scheduler before the first optimizer step",
    Say.OPT_DELAYED: "the MindSpore schedule is the torch schedule delayed by one step: MindSpore's step t+1 uses "
                     "torch's rate of step t",
    Say.OPT_DELAYED_FIX_MS: "drop the first MindSpore rate: lr_list = lr_list[1:]",
    Say.OPT_DELAYED_FIX_TORCH: "step the torch scheduler once more before training",
    Say.OPT_SCALED: "the MindSpore rates are the torch rates times {ratio:.6g} at every step",
    Say.OPT_SCALED_FIX_MS: "scale the MindSpore schedule's base rate",
    Say.OPT_SCALED_FIX_TORCH: "scale the torch base lr",
    Say.OPT_RATES_FROM: _opt_rates_from,
    Say.OPT_RATES_FIX_MS: "learning_rate=[the torch rate of each step] (read it from the torch scheduler: "
                          "optimizer.param_groups[0]['lr'] before each scheduler.step())",
    Say.OPT_RATES_FIX_TORCH: "a torch LambdaLR reproducing the MindSpore rates",
    Say.OPT_UNSUPPORTED: lambda w: fill(w["why"], side=w["side"], cls=w["cls"], supported=", ".join(w["supported"])),
    Say.OPT_UNPAIRED_PARAMS: "{count} torch optimizer parameter(s) have no MindSpore counterpart in the name mapping "
                             "and were not compared: {names!j}",
    Say.OPT_WD_DYNAMIC: "MindSpore weight decay is dynamic (a Cell): compared at the current step only",
    Say.OPT_PLATEAU: "torch ReduceLROnPlateau depends on the metric: only its current rate was compared",
    Say.OPT_LR_LIST: "learning_rate list ({count} entries)",
    Say.OPT_CONSTANT_IGNORED: "constant (the scheduler's rates are not applied)",
    Say.SOURCE_FINDING: "{call}: {difference}; {why}",
    Say.SOURCE_DEFAULT: _source_default,
    Say.SOURCE_COMPLEMENT: "{argument}={written} is {torch_api}({torch_argument}={one_minus})",
    Say.SOURCE_PASSED: "{argument}={written}, where {torch_api} has {torch_argument}={torch_default!r}",
    Say.SAME_STRIDE_ONE: _same,
    Say.SAME_KERNEL_LE_STRIDE: _same,
    Say.SKIP_UNREADABLE: "{file}:0: cannot be read ({error})",
    Say.SKIP_NESTED: "{file}:0: too deeply nested to parse",
}
