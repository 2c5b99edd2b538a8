"""What the audit says, as codes: each finding, group, note, probe outcome and prose fix is `Words(Say.X, data)`,
and aligner/render/words/audit.py holds the sentence of each code."""
from __future__ import annotations

import enum


class Say(enum.Enum):
    """One kind of sentence of the model, optimizer or source audit (the data each takes: its template)."""

    # a layer pair's setting (model.py)
    LAYER = "layer"                          # where, kind, said, why: what a rule found at a pair
    SETTING = "setting"                      # attribute, torch, ms, meaning, defaults
    PADDING = "padding"                      # torch, ms (pads per axis), sizes
    CEIL_MODE = "ceil_mode"                  # torch, ms, torch_out, ms_out, sizes
    COUNT_INCLUDE_PAD = "count_include_pad"  # torch, ms, sizes
    DTYPE = "dtype"                          # torch, ms
    SIZE_ONE = "size_one"                    # size: the traced input size
    SIZE_EVERY = "size_every"                # size
    SIZE_SOME = "size_some"                  # parity (0 even, 1 odd, None mixed), size
    PAD_FIX_MS = "pad_fix_ms"                # pads (F.pad order), value, cls
    PAD_FIX_TORCH = "pad_fix_torch"          # pads, fill, cls
    # initialisation
    INIT_LAW = "init_law"                    # where, migrated, name, law, reference, ref_law
    INIT_LAW_GROUP = "init_law_group"        # own, migrated, law, reference, ref_law (law names only)
    LAW = "law"                              # name, std, n, constant
    INIT_FIX = "init_fix"                    # name, mean, std
    INIT_FIX_EACH = "init_fix_each"          # line: the rules' initializer line for one parameter P
    INIT_FIX_EACH_DEFAULT = "init_fix_each_default"
    # probes
    PROBE = "probe"                          # where, kind, max_diff, shape, torch_class, ms_class
    PROBE_GROUP = "probe_group"              # kind, torch_class, ms_class
    PROBE_FIX = "probe_fix"                  # fix: the framework layer that reproduces the reference
    PROBE_NO_FIX = "probe_no_fix"            # migrated
    PROBE_EQUAL = "probe_equal"              # atol, rtol, max_diff
    PROBE_DIFFERS = "probe_differs"          # max_diff
    NOT_PROBED = "not_probed"                # why
    SHAPES_DIFFER = "shapes_differ"          # torch, ms: the traced input shapes
    PARAMS_DIFFER = "params_differ"          # torch, ms: the parameter names
    PARAM_SHAPES_DIFFER = "param_shapes_differ"
    NONE_RAN = "none_ran"                    # failures: (shape, exception name) per shape tried
    # weight sharing, unpaired layers, notes
    SHARING = "sharing"                      # side, shared, other, separate
    TIE_FIX = "tie_fix"                      # one, others
    UNTIE_FIX = "untie_fix"                  # one, others
    UNPAIRED = "unpaired"                    # call: (index, count) of a layer called several times, or None
    NO_INPUTS = "no_inputs"
    ONE_OPTIMIZER = "one_optimizer"
    # optimizers (optimizers.py, optsides.py)
    OPT_HEAD = "opt_head"                    # torch, ms: the two classes
    OPT_ALL = "opt_all"                      # count: every parameter
    OPT_SETTING = "opt_setting"              # head, label, torch, ms, names, why: the rules' texts
    OPT_FORMULA = "opt_formula"              # head, names, torch, ms, why (a rules template), ratio, eps_factor
    OPT_FORMULA_FIX_TORCH = "opt_formula_fix_torch"   # cls
    OPT_NO_ARGUMENT_FIX = "opt_no_argument_fix"       # cls, attribute, twin, assignment
    OPT_GROUP_FIX = "opt_group_fix"                   # cls, assignment, names: the parameters to group
    OPT_GROUP_NO_DECAY_FIX = "opt_group_no_decay_fix"  # cls, value, names: MindSpore nn's no-decay group
    OPT_GROUP_DECAY_FIX = "opt_group_decay_fix"       # cls, value, names
    OPT_NOT_OPTIMIZED = "opt_not_optimized"  # head, why (a rules template), names, count, side
    OPT_ADD_FIX = "opt_add_fix"              # side
    OPT_LEAVE_OUT_FIX = "opt_leave_out_fix"  # side
    OPT_LOSS_SCALE = "opt_loss_scale"        # head, scale, why
    OPT_LOSS_SCALE_FIX = "opt_loss_scale_fix"  # cls, scale
    OPT_GRAD_CENTRALIZATION = "opt_grad_centralization"  # head, names, why
    OPT_GRAD_CENTRALIZATION_FIX = "opt_grad_centralization_fix"
    OPT_SCHEDULER_IGNORED = "opt_scheduler_ignored"  # head, scheduler, why
    OPT_LR_SHORT = "opt_lr_short"            # head, source, last, steps, names, why
    OPT_LR_SHORT_FIX = "opt_lr_short_fix"
    OPT_LR = "opt_lr"                        # head, torch, ms, names
    OPT_LR_SCHEDULE = "opt_lr_schedule"      # head, step, torch, ms, names, torch_source, ms_source, detail
    OPT_SHIFTED = "opt_shifted"              # base: the torch rate of step 0
    OPT_SHIFTED_FIX_MS = "opt_shifted_fix_ms"
    OPT_SHIFTED_FIX_TORCH = "opt_shifted_fix_torch"
    OPT_DELAYED = "opt_delayed"
    OPT_DELAYED_FIX_MS = "opt_delayed_fix_ms"
    OPT_DELAYED_FIX_TORCH = "opt_delayed_fix_torch"
    OPT_SCALED = "opt_scaled"                # ratio
    OPT_SCALED_FIX_MS = "opt_scaled_fix_ms"
    OPT_SCALED_FIX_TORCH = "opt_scaled_fix_torch"
    OPT_RATES_FROM = "opt_rates_from"        # step, rates: the torch rates from that step
    OPT_RATES_FIX_MS = "opt_rates_fix_ms"
    OPT_RATES_FIX_TORCH = "opt_rates_fix_torch"
    OPT_UNSUPPORTED = "opt_unsupported"      # why (a rules template), side, cls, supported
    OPT_UNPAIRED_PARAMS = "opt_unpaired_params"  # count, names
    OPT_WD_DYNAMIC = "opt_wd_dynamic"
    OPT_PLATEAU = "opt_plateau"
    OPT_LR_LIST = "opt_lr_list"              # count: a learning_rate list's entries
    OPT_CONSTANT_IGNORED = "opt_constant_ignored"
    # the source audit (source.py)
    SOURCE_FINDING = "source_finding"        # call: as written, difference, why
    SOURCE_DEFAULT = "source_default"        # argument, default, also: (class, argument, value) or None, torch_api,
    #                                          torch_argument, torch_default
    SOURCE_COMPLEMENT = "source_complement"  # argument, written, one_minus, torch_api, torch_argument
    SOURCE_PASSED = "source_passed"          # argument, written, torch_api, torch_argument, torch_default
    SAME_STRIDE_ONE = "same_stride_one"      # by_default, padding: the torch padding 'same' equals (None: 'same' only)
    SAME_KERNEL_LE_STRIDE = "same_kernel_le_stride"  # by_default
    SKIP_UNREADABLE = "skip_unreadable"      # file, error
    SKIP_NESTED = "skip_nested"              # file
