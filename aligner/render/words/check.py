"""The sentences of `align check`: each health rule's finding and fix, the cross-rank rules', the notes, and the
`aligner.watch` log line (codes: pipelines/check/says.py). A record is worded from its kind, io and module."""
from __future__ import annotations

import enum
import math
import shlex
from typing import Any

from aligner.core.text import short_number as _g
from aligner.core.words import Words
from aligner.dumping.manifest import Io, Kind
from aligner.pipelines.check.says import Say
from aligner.render.words import Template


def _record(kind: Any, io: Any, module: str) -> str:
    """'the output of fc1', 'the gradient entering fc1', 'the gradient of fc1.weight'."""
    if kind == Kind.FORWARD:
        return f"the {'input' if io == 'input' else 'output'} of {module or 'the model'}"
    if kind == Kind.BACKWARD:
        return f"the gradient {'entering' if io == 'grad_output' else 'leaving'} {module or 'the model'}"
    if kind == Kind.PARAM_GRAD:
        return f"the gradient of {module}"
    return f"{kind} {module}"


_NONFINITE_WHY: dict[enum.Enum, str] = {
    Say.NONFINITE_INPUT: "the model's input already holds them",
    Say.NONFINITE_BETWEEN: "code between module calls computed it (the records before it are finite)",
    Say.NONFINITE_OP: "every record before it in execution order is finite, its inputs included"}


def _nonfinite(w: Words) -> str:
    d = w.fields
    counts = f"{d['nan']} NaN and {d['inf']} Inf of {d['numel']} elements"
    return (f"first NaN/Inf at step {d['step']}: {_record(d['kind'], d['io'], d['module'])} ({d['type']}) holds "
            f"{counts}; {_NONFINITE_WHY[w.code]}")


def _later(w: Words) -> str:
    later = ", ".join(f"{t} ({module or 'model'})" for t, module in w["later"]) + (" ..." if w["more"] else "")
    return f"NaN/Inf also at steps {later}"


def _fp16_overflow(w: Words) -> str:
    d = w.fields
    more = f" ({d['more']} more such records at this step)" if d["more"] else ""
    return (f"{_record(d['kind'], d['io'], d['module'])} reaches |v| = {_g(d['value'])}, {d['times']:.2g}x "
            f"float16's largest value 65504 (threshold {_g(d['limit'])}): float16 (mixed precision, Ascend) "
            f"overflows to Inf here{more}")


def _fp16_underflow(w: Words) -> str:
    d = w.fields
    how = "are subnormal in this float16 run (precision lost, many flushed to 0)" if d["subnormal"] \
        else "would underflow to 0 in float16 without loss scaling"
    return (f"{d['hits']} of {d['total']} parameter gradients at step {d['step']} have {_g(d['percent'])}%+ "
            f"of their nonzero values below 6.1e-5 (float16's smallest normal; {d['module']}: {d['tiny']:.0%}): "
            f"they {how}")


def _depth(w: Words) -> str:
    d = w.fields
    if w.code is Say.VANISHING:
        return (f"gradients vanish with depth: |grad {d['first']}| = {_g(d['norm'])} is {_g(d['ratio'])} of "
                f"|grad {d['last']}| (below {_g(d['limit'])})")
    return (f"gradients grow with depth: |grad {d['first']}| = {_g(d['norm'])} is {_g(d['ratio'])}x "
            f"|grad {d['last']}| (above {_g(d['limit'])})")


def _norm_nonfinite(w: Words) -> str:
    return f"the global gradient norm went from {_g(w['norm'])} at step {w['step']} to NaN/Inf at step {w['then']}"


def _norm_growth(w: Words) -> str:
    d = w.fields
    return (f"the global gradient norm grows {_g(d['growth'])}x or more per step: {_g(d['start'])} at step "
            f"{d['start_step']} -> {_g(d['norm'])} at step {d['step']}")


def _frozen(w: Words) -> str:
    how = "" if w["exact"] else " (its statistics are identical)"
    return (f"{w['name']} has a nonzero gradient at step {w['step']} but did not change by step {w['step'] + 1}{how}: "
            "the optimizer does not update it")


def _update(w: Words) -> str:
    d = w.fields
    if w.code is Say.UPDATE_LARGE:
        bound = "at least " if d["bound"] else ""
        by = f"by {bound}{_g(d['ratio'])} of its norm (above {_g(d['limit'])}; about 1e-3 is typical)"
    else:
        by = f"by only {_g(d['ratio'])} of its norm (below {_g(d['limit'])}; about 1e-3 is typical)"
    more = f" ({d['count']} of {d['weights']} weights)" if d["count"] > 1 else ""
    return f"step {d['step']} changed {d['name']} " + by + more


def _saturated(w: Words) -> str:
    ends = "0 or 1" if w["sigmoid"] else "-1 or 1"
    return (f"{w['share']:.0%} of the outputs of {w['module']} ({w['type']}) are within 0.01 of {ends}: saturated, "
            "their gradient is nearly 0")


def _constant(w: Words) -> str:
    low = w["value"]
    what = "all zeros" if low == 0 else f"the constant {_g(float(low))}"
    return f"the output of {w['module'] or 'the model'} ({w['type']}) is {what} ({w['numel']} elements)"


def _loss_scale_overflow(w: Words) -> str:
    d = w.fields
    return (f"the gradients hold NaN/Inf at every one of the {d['steps']} dumped steps (loss scale "
            f"{_g(d['first'])} at step {d['first_step']} -> {_g(d['last'])} at step {d['last_step']}): every step is "
            "skipped or corrupts the weights")


def _clip_before_unscale(w: Words) -> str:
    d = w.fields
    return (f"clipping saw the gradients still multiplied by the loss scale {_g(d['scale'])} at step {d['step']}: "
            f"grad_norm {_g(d['norm'])} equals the scaled gradients' norm (unscaled: {_g(d['unscaled'])}), so "
            f"max_norm clips a norm {_g(d['scale'])}x too large")


def _grads_not_unscaled(w: Words) -> str:
    d = w.fields
    return (f"the optimizer got gradients of norm {_g(d['norm'])} at step {d['step']} ({d['probe']}), "
            f"{d['norm'] / d['unscaled']:.3g}x the unscaled gradients' norm {_g(d['unscaled'])} (loss scale "
            f"{_g(d['scale'])}): they were not divided by the loss scale")


def _loss_spike(w: Words) -> str:
    d = w.fields
    return (f"the loss breaks its trend at step {d['step']}: {_g(d['value'])}, {d['value'] / d['best']:.3g}x its "
            f"lowest so far {_g(d['best'])}")


def _gradient_jump(w: Words) -> str:
    d = w.fields
    more = f" (and {d['others']} more)" if d["others"] else ""
    return (f"the gradient norm of {d['name']}{more} breaks its trend at step {d['step']}: {_g(d['before'])} -> "
            f"{_g(d['after'])} ({d['after'] / d['before']:.3g}x in one step)")


def _ranks_differ(w: Words) -> str:
    """'rank 1 from rank 0 in fc.weight (max |diff| 0.5; 2 parameter(s) differ)'."""
    d = w.fields
    who = ", ".join(f"rank {r} from rank {ref}" for r, ref in d["who"])
    how = "not comparable: missing on a rank, another shape or dtype, or NaN/Inf elsewhere" if math.isinf(d["diff"]) \
        else f"max |diff| {d['diff']:.3g}"
    return f"{who} in {d['name']} ({how}; {d['names']} parameter(s) differ)"


def _rank_weights(w: Words) -> str:
    if w.code is Say.RANK_WEIGHTS_START:
        return (f"the weights at step {w['step']}, the first dumped, differ across data-parallel ranks: "
                f"{_ranks_differ(w)}: the ranks did not start from the same weights")
    return (f"the weights drift apart at step {w['step']} (equal before it): {_ranks_differ(w)}: the ranks applied "
            "different updates")


def _rank_grads(w: Words) -> str:
    return (f"the gradients after the all-reduce differ across data-parallel ranks at step {w['step']}: "
            f"{_ranks_differ(w)}: the all-reduce did not run, or not over these ranks")


def _rank_record(kind: Any, io: Any, module: str) -> str:
    """'the gradient after the all-reduce of fc.weight', 'the value of fc.weight', 'forward output of fc'."""
    reduced = " after the all-reduce" if io == Io.REDUCED else ""
    what = {Kind.PARAM: "the value of", Kind.PARAM_GRAD: f"the gradient{reduced} of"}.get(kind)
    return f"{what} {module}" if what else f"{kind} {io} of {module or 'the model'}"


def _rank_nonfinite(w: Words) -> str:
    d = w.fields
    message = (f"the first NaN/Inf over {d['ranks']} ranks is on rank {d['rank']} at step {d['step']}: "
               f"{_rank_record(d['kind'], d['io'], d['module'])} ({d['type']}) holds {d['nan']} NaN and {d['inf']} Inf")
    later = [f"rank {r} at step {s} ({_rank_record(kind, io, module)})" for r, s, kind, io, module in d["later"]]
    if later:
        message += "; then " + ", ".join(later)
    return message


def _fix_rank_nonfinite(w: Words) -> str:
    command = shlex.quote(f"{w['directory']}/rank{w['rank']}")
    return (f"look at rank {w['rank']}'s own nonfinite finding (align check {command}): its data shard or its "
            "computation; NaN reaching other ranks through the all-reduce is inherited")


def _ranks_as_one(w: Words) -> str:
    return (f"no header names data-parallel groups: all {w['world']} ranks are compared as one (pure data "
            "parallelism); with tensor/pipeline parallelism pass aligner.dump(..., groups={'dp': ...})")


def _watch(w: Words) -> str:
    """'aligner.watch: RULE (SEVERITY) at step N in WHERE: MESSAGE; fix: FIX' (one log line)."""
    d = w.fields
    where = ", ".join(p for p in d["where"] if p) or "the model"
    step = "" if d["step"] is None else f" at step {d['step']}"
    fix = f"; fix: {d['fix']}" if d["fix"] else ""
    return f"aligner.watch: {d['rule']} ({d['severity'].value}){step} in {where}: {d['message']}{fix}"


TEMPLATES: dict[Say, Template] = {
    Say.NONFINITE_INPUT: _nonfinite,
    Say.NONFINITE_BETWEEN: _nonfinite,
    Say.NONFINITE_OP: _nonfinite,
    Say.NONFINITE_LATER: _later,
    Say.FIX_NONFINITE_DATA: "check the data for missing values (checklist ds.01)",
    Say.FIX_NONFINITE_BETWEEN: "look at the code that computes the input of {module} in its parent's forward",
    Say.FIX_NONFINITE_OP: "zoom in: aligner.dump(model, DIR, ops=True, scope={scope!r}) names the op; look for "
                          "log/sqrt/division of zero or values past float16's 65504 (checklist mp.01: loss scale, "
                          "float32 for that op)",
    Say.FP16_OVERFLOW: _fp16_overflow,
    Say.FIX_FP16_OVERFLOW: "normalise the input or rescale this layer; under mixed precision keep it in float32 "
                           "(torch autocast custom_fwd / MindSpore cell.to_float(mstype.float32)); gradients: a "
                           "smaller loss scale; checklist mp.01",
    Say.FP16_UNDERFLOW: _fp16_underflow,
    Say.FIX_FP16_UNDERFLOW: "use loss scaling (torch.amp.GradScaler / MindSpore DynamicLossScaleManager) so "
                            "gradients sit in float16's range; checklist mp.02",
    Say.VANISHING: _depth,
    Say.FIX_VANISHING: "use ReLU-family activations with He (Kaiming) init, normalisation layers or residual "
                       "connections; look for saturated sigmoid/tanh (saturated-activations)",
    Say.DEPTH_GROWTH: _depth,
    Say.NORM_NONFINITE: _norm_nonfinite,
    Say.NORM_GROWTH: _norm_growth,
    Say.FIX_EXPLODING: "lower the initial weights (He/Xavier init) or the learning rate, add gradient clipping "
                       "(clip_grad_norm_ / ops.clip_by_global_norm); checklist hp.01, wi.01",
    Say.FROZEN: _frozen,
    Say.FIX_FROZEN: "pass it to the optimizer (torch: model.parameters(); MindSpore: net.trainable_params()), or set "
                    "requires_grad=False if it is meant to be frozen; checklist cg.02",
    Say.UPDATE_LARGE: _update,
    Say.UPDATE_SMALL: _update,
    Say.FIX_UPDATE_LARGE: "lower the learning rate (or its warm-up peak); checklist hp.01",
    Say.FIX_UPDATE_SMALL: "raise the learning rate, or look for vanishing gradients or a weight decay cancelling the "
                          "update; checklist hp.01",
    Say.UPDATE_BOUND_NOTE: "update-ratio: statistics-only dump, so ||w(t+1) - w(t)|| is bounded below by "
                           "|l2(t+1) - l2(t)|; 'too large' is checked on that bound, 'too small' is not checked",
    Say.DEAD_RELU: "{zeros:.0%} of the outputs of {module} ({type}) are exactly 0 (dead ReLUs: no gradient flows "
                   "through them)",
    Say.FIX_DEAD_RELU: "normalise the input, lower the learning rate, use He init with zero biases, or LeakyReLU/GELU",
    Say.SATURATED: _saturated,
    Say.FIX_SATURATED: "normalise the layer's input (BatchNorm/LayerNorm before it), use Xavier init, or a "
                       "ReLU-family activation",
    Say.CONSTANT: _constant,
    Say.FIX_CONSTANT: "check the layer's weights (all-zero init, checklist wi.01) and its input; a constant output "
                      "carries no information and passes no useful gradient",
    Say.LOSS_SCALE_OVERFLOW: _loss_scale_overflow,
    Say.FIX_LOSS_SCALE_OVERFLOW: "lower the initial loss scale (init_loss_scale / GradScaler(init_scale=...)) or use "
                                 "dynamic loss scaling; checklist mp.01, mp.02",
    Say.CLIP_BEFORE_UNSCALE: _clip_before_unscale,
    Say.FIX_CLIP_BEFORE_UNSCALE: "unscale before clipping (torch: scaler.unscale_(optimizer) then clip_grad_norm_; "
                                 "MindSpore: divide the gradients by the loss scale, then ops.clip_by_global_norm); "
                                 "checklist mp.03",
    Say.GRADS_NOT_UNSCALED: _grads_not_unscaled,
    Say.FIX_GRADS_NOT_UNSCALED: "unscale before the update (torch: scaler.step(optimizer) or scaler.unscale_; "
                                "MindSpore: DynamicLossScaleUpdateCell / divide the gradients by the scale); checklist "
                                "mp.02, mp.04",
    Say.LOSS_NONFINITE: "the loss is {value} at step {step}",
    Say.FIX_LOSS_NONFINITE: "see the nonfinite finding for the first record holding NaN/Inf",
    Say.LOSS_SPIKE: _loss_spike,
    Say.FIX_LOSS_SPIKE: "lower the learning rate or add clipping; look at the gradient-trend and update-ratio "
                        "findings of the step before",
    Say.GRADIENT_JUMP: _gradient_jump,
    Say.FIX_GRADIENT_JUMP: "look at what changed at that step: the batch, the learning rate schedule, a loss scale "
                           "update; compare with the loss-trend finding",
    Say.RANK_WEIGHTS_START: _rank_weights,
    Say.FIX_RANK_WEIGHTS_START: "seed every rank alike before building the model (aligner.fix_random(seed) with one "
                                "seed on every rank), or broadcast rank 0's weights (DistributedDataParallel does at "
                                "construction; MindSpore's DistributedGradReducer does not); checklist: seed "
                                "consistency across cards",
    Say.RANK_WEIGHTS_DRIFT: _rank_weights,
    Say.FIX_RANK_WEIGHTS_DRIFT: "see rank-grads: gradients not all-reduced (no_sync, a rank-local optimizer state or "
                                "learning rate)",
    Say.RANK_GRADS: _rank_grads,
    Say.FIX_RANK_GRADS: "all-reduce every gradient before the update: DDP's backward outside no_sync() (or sync at "
                        "the last accumulation step), MindSpore's DistributedGradReducer over the data-parallel "
                        "group; check the groups",
    Say.RANK_GRADS_NOTE: "rank-grads compares gradients after the all-reduce (param_grad io 'reduced'); the io 'grad' "
                         "records are each rank's own gradient as autograd computed it, before the all-reduce, which "
                         "differ across ranks by design",
    Say.RANK_NONFINITE: _rank_nonfinite,
    Say.FIX_RANK_NONFINITE: _fix_rank_nonfinite,
    Say.RANKS_AS_ONE: _ranks_as_one,
    Say.WATCH: _watch,
}
