"""Read one live optimizer (and its learning-rate schedule) into the update each parameter gets, per the optimizer
catalogue (mappings/optimizers.yaml: each class's formula and where it keeps each setting): torch.optim and MindSpore
mint/experimental optimizers keep torch-style `param_groups`; MindSpore's legacy nn optimizers keep per-parameter
`learning_rate`, `weight_decay` (times `loss_scale`) and `decay_flags` (gamma/beta skipped when weight_decay is one
number). Schedules are read without touching the user's objects: a torch scheduler is stepped on a deep copy, a
MindSpore LRScheduler on a copy with its own counters, a LearningRateSchedule cell or a dynamic lr list is evaluated at
global_step 0..N-1."""
from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any

from aligner.core.errors import AlignerError
from aligner.core.findings import Severity
from aligner.core.frameworks import Framework
from aligner.core.rules import ListOf, Opt, load_rules
from aligner.core.words import Text, words
from aligner.mapping.optimizers import Family, OptimizerClass, catalogue
from aligner.pipelines.audit.says import Say
from aligner.pipelines.diff.rules import UpdateRule

RULES_FILE = "audit_optimizers.yaml"
PT, MS = Framework.PYTORCH, Framework.MINDSPORE


_RULE = {"severity": Severity, "why": Opt(str)}
SCHEMA = {
    "tolerance": {"rtol": float, "peak_rtol": float},
    "default_steps": int,
    "compare": ListOf({"id": str, "attribute": str, "severity": Severity, "families": Opt(ListOf(Family)),
                       "why": Opt(str), "why_gamma_beta": Opt(str)}),
    "rules": {rule: _RULE for rule in (
        "optimizer-unsupported", "optimizer-not-optimized", "optimizer-lr", "optimizer-lr-schedule",
        "optimizer-lr-list-short", "optimizer-loss-scale", "optimizer-grad-centralization",
        "optimizer-scheduler-ignored")},
}


def load_table() -> dict[str, Any]:
    """The audit's comparison rules (mappings/audit_optimizers.yaml; the classes are the catalogue's)."""
    return load_rules(RULES_FILE, SCHEMA)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The rate one side applies at steps 0..n-1 (shorter than asked when a dynamic lr list ends), and its source."""

    source: Text
    rates: tuple[float, ...]
    length: int | None = None       # a finite lr list's length

    @property
    def constant(self) -> bool:
        return len(set(self.rates)) <= 1


@dataclasses.dataclass(frozen=True)
class ParamUpdate:
    """What update one parameter gets: the rule at step 0 (UpdateRule: family, lr, betas, eps, weight decay, momentum),
    what UpdateRule does not hold, and which of the side's schedules sets its rate."""

    name: str
    rule: UpdateRule
    amsgrad: bool = False
    maximize: bool = False
    schedule: int = 0
    group: int = 0

    def setting(self, attribute: str) -> Any:
        """One compared setting in torch's meaning."""
        if attribute == "betas":
            return (self.rule.beta1, self.rule.beta2)
        if attribute in ("amsgrad", "maximize"):
            return getattr(self, attribute)
        return getattr(self.rule, attribute)


@dataclasses.dataclass(frozen=True)
class OptimizerSide:
    """One framework's optimizer read per parameter (model names), its schedules, and what else was visible."""

    framework: Framework
    class_name: str                       # the qualified class name
    short: str                            # how messages name it (nn.Momentum, torch.optim.AdamW)
    spec: OptimizerClass | None           # its catalogue entry (None: a class the audit does not read)
    params: dict[str, ParamUpdate]
    schedules: tuple[Schedule, ...]
    reads: frozenset[str] = frozenset()   # the settings this class has (the catalogue's read)
    not_optimized: tuple[str, ...] = ()   # trainable model parameters the optimizer does not hold
    loss_scale: float = 1.0
    grad_centralization: tuple[str, ...] = ()
    scheduler: str | None = None
    scheduler_ignored: bool = False       # a scheduler was given but the class applies its constructor lr
    notes: tuple[Text, ...] = ()

    @property
    def supported(self) -> bool:
        return self.spec is not None

    def argument(self, setting: str) -> str | tuple[str, ...]:
        """How this class's constructor spells `setting` (torch's name: nesterov -> use_nesterov on nn.Momentum,
        lr -> learning_rate on nn cells); the setting's own name where the catalogue gives none."""
        found = self.spec.argument(setting) if self.spec is not None else None
        return found if found is not None else setting


def qualname(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__name__}"


def _plain(value: Any) -> Any:
    """A torch/MindSpore scalar or 1-element tensor as a Python number; other values unchanged."""
    if hasattr(value, "asnumpy"):
        arr = value.asnumpy()
        return arr.reshape(-1)[0].item() if arr.size == 1 else tuple(arr.reshape(-1).tolist())
    if hasattr(value, "detach"):
        arr = value.detach().cpu().numpy()
        return arr.reshape(-1)[0].item() if arr.size == 1 else tuple(arr.reshape(-1).tolist())
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value


def optimizer_framework(obj: Any) -> Framework | None:
    """PyTorch for a torch.optim.Optimizer, MindSpore for an nn.Optimizer or an experimental/mint one, else None."""
    for cls in type(obj).__mro__:
        where = f"{cls.__module__}.{cls.__name__}"
        if where == "torch.optim.optimizer.Optimizer":
            return PT
        if where in ("mindspore.nn.optim.optimizer.Optimizer", "mindspore.experimental.optim.optimizer.Optimizer"):
            return MS
    return None


def scheduler_framework(obj: Any) -> Framework | None:
    """The framework of a learning-rate scheduler object (torch LRScheduler / ReduceLROnPlateau, MindSpore
    experimental LRScheduler), else None."""
    module = type(obj).__module__
    if module.startswith("torch.optim.lr_scheduler") or any(
            c.__module__ == "torch.optim.lr_scheduler" for c in type(obj).__mro__):
        return PT
    if any(c.__module__ == "mindspore.experimental.optim.lr_scheduler" for c in type(obj).__mro__):
        return MS
    return None


def supported_names() -> list[str]:
    """The short names of every optimizer class the audit reads (the catalogue's, in its order)."""
    return [c.short for c in catalogue().classes]


def _entry(fw: Framework, optimizer: Any) -> OptimizerClass | None:
    found = catalogue().by_qualname.get(qualname(optimizer))
    return found if found is not None and found.framework == fw else None


def _reads(entry: OptimizerClass | None) -> dict[str, Any]:
    return entry.read if entry else {}


def _read(spec: Any, source: Any, groups: bool) -> Any:
    """One setting from a group dict (groups) or an optimizer attribute (nn): a name, a list of names, {const}."""
    if isinstance(spec, dict):
        return spec["const"]
    if isinstance(spec, list):
        return tuple(_read(s, source, groups) for s in spec)
    value = source.get(spec) if groups else getattr(source, spec, None)
    return _plain(value)


def _rule(family: Family, lr: float, wd: float, settings: dict[str, Any]) -> tuple[UpdateRule, bool, bool]:
    betas = settings.get("betas") or (0.0, 0.0)
    return (UpdateRule(family, float(lr), weight_decay=float(wd), momentum=float(settings.get("momentum") or 0.0),
                       dampening=float(settings.get("dampening") or 0.0), nesterov=bool(settings.get("nesterov")),
                       beta1=float(betas[0]), beta2=float(betas[1]), eps=float(settings.get("eps") or 0.0)),
            bool(settings.get("amsgrad")), bool(settings.get("maximize")))


def _foreign(side: str, count: int, shapes: list[tuple[int, ...]]) -> AlignerError:
    shown = ", ".join(str(s) for s in shapes[:3]) + (" ..." if len(shapes) > 3 else "")
    return AlignerError(f"the {side} optimizer holds {count} parameter(s) that are not the {side} model's (shapes "
                        f"{shown}): build the optimizer from this model's parameters")


# --- torch -------------------------------------------------------------------------------------------------------
def read_torch(optimizer: Any, model: Any, scheduler: Any, steps: int) -> OptimizerSide:
    """The torch side: per-parameter settings from `param_groups`, the schedule from a deep copy of the scheduler."""
    names = {id(p): n for n, p in model.named_parameters()}
    entry = _entry(PT, optimizer)
    params: dict[str, ParamUpdate] = {}
    foreign: list[tuple[int, ...]] = []
    for gi, group in enumerate(optimizer.param_groups):
        settings = {k: _read(spec, group, True) for k, spec in _reads(entry).items()}
        family = entry.family if entry else Family.SGD
        if entry and entry.decoupled_if and group.get(entry.decoupled_if):
            family = Family.ADAMW
        rule, amsgrad, maximize = _rule(family, _plain(group["lr"]), _plain(group.get("weight_decay", 0.0)),
                                        settings)
        for p in group["params"]:
            if id(p) not in names:
                foreign.append(tuple(p.shape))
                continue
            params[names[id(p)]] = ParamUpdate(names[id(p)], rule, amsgrad, maximize, gi, gi)
    if foreign:
        raise _foreign(PT.label, len(foreign), foreign)
    schedules, source, notes = _torch_schedules(optimizer, scheduler, steps)
    not_opt = tuple(n for n, p in model.named_parameters() if p.requires_grad and n not in params)
    return OptimizerSide(PT, qualname(optimizer), entry.short if entry else type(optimizer).__name__,
                         entry, params, schedules, frozenset(_reads(entry)), not_opt, scheduler=source,
                         notes=tuple(notes))


def _torch_schedules(optimizer: Any, scheduler: Any, steps: int
                     ) -> tuple[tuple[Schedule, ...], str | None, list[Text]]:
    """Each group's rate at steps 0..steps-1: read before each scheduler step (torch steps the scheduler after the
    optimizer), on a deep copy sharing only the parameters."""
    base = [float(_plain(g["lr"])) for g in optimizer.param_groups]
    if scheduler is None:
        return tuple(Schedule("constant", (lr,) * steps) for lr in base), None, []
    name = type(scheduler).__name__
    driven: Any = getattr(scheduler, "optimizer", None)
    if driven is not optimizer:
        raise AlignerError(f"the torch scheduler {name} does not drive the torch optimizer given with it")
    if name == "ReduceLROnPlateau":
        return (tuple(Schedule("constant", (lr,) * steps) for lr in base), name,
                [words(Say.OPT_PLATEAU)])
    memo = {id(p): p for g in optimizer.param_groups for p in g["params"]}
    try:
        copied: tuple[Any, Any] = copy.deepcopy((optimizer, scheduler), memo)
    except Exception as exc:  # a user-defined scheduler may hold anything
        raise AlignerError(f"cannot copy the torch scheduler {name} to read its rates: {type(exc).__name__}: "
                           f"{exc}") from None
    opt_copy, sched_copy = copied
    rates: list[list[float]] = [[] for _ in base]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            for i, group in enumerate(opt_copy.param_groups):
                rates[i].append(float(_plain(group["lr"])))
            sched_copy.step()
    return tuple(Schedule(name, tuple(r)) for r in rates), name, []


# --- MindSpore -----------------------------------------------------------------------------------------------------
def read_mindspore(optimizer: Any, model: Any, scheduler: Any, steps: int) -> OptimizerSide:
    """The MindSpore side: legacy nn optimizers per parameter, mint/experimental ones per group."""
    names = {id(p): n for n, p in model.parameters_and_names()}
    by_name = {p.name: n for n, p in model.parameters_and_names()}
    entry = _entry(MS, optimizer)
    legacy = any(f"{c.__module__}.{c.__name__}" == "mindspore.nn.optim.optimizer.Optimizer"
                 for c in type(optimizer).__mro__)
    if legacy:
        params, schedules, extra = _read_legacy(optimizer, entry, steps)
    else:
        params, schedules, extra = _read_groups(optimizer, entry, scheduler, steps)
    named: dict[str, ParamUpdate] = {}
    foreign: list[tuple[int, ...]] = []
    for param, update in params:
        name = names.get(id(param)) or by_name.get(param.name)
        if name is None:
            foreign.append(tuple(param.shape))
            continue
        named[name] = dataclasses.replace(update, name=name)
    if foreign:
        raise _foreign(MS.label, len(foreign), foreign)
    not_opt = tuple(n for n, p in model.parameters_and_names() if p.requires_grad and n not in named)
    gc = tuple(names.get(id(p), p.name) for p in extra.pop("grad_centralization", ()))
    return OptimizerSide(MS, qualname(optimizer), entry.short if entry else type(optimizer).__name__,
                         entry, named, schedules, frozenset(_reads(entry)), not_opt, grad_centralization=gc,
                         **extra)


def _read_legacy(opt: Any, entry: OptimizerClass | None, steps: int
                 ) -> tuple[list[tuple[Any, ParamUpdate]], tuple[Schedule, ...], dict[str, Any]]:
    """nn.Optimizer: `learning_rate` (one, or one per parameter when grouped), `weight_decay` (one Tensor, or a
    tuple per parameter) times `loss_scale`, `decay_flags` per parameter."""
    from mindspore import Tensor, int32

    params = list(opt._parameters)
    loss_scale = float(getattr(opt, "loss_scale", 1.0))
    step0 = int(_plain(opt.global_step)) if hasattr(opt, "global_step") else 0
    settings = {k: _read(spec, opt, False) for k, spec in _reads(entry).items()}
    family = entry.family if entry else Family.SGD
    cache: dict[int, int] = {}
    schedules: list[Schedule] = []
    notes: list[Text] = []

    def schedule_of(lr_obj: Any) -> int:
        if id(lr_obj) not in cache:
            cache[id(lr_obj)] = len(schedules)
            schedules.append(_legacy_schedule(lr_obj, step0, steps))
        return cache[id(lr_obj)]

    def wd_value(obj: Any) -> float:
        if hasattr(obj, "construct") and not isinstance(obj, Tensor):
            notes.append(words(Say.OPT_WD_DYNAMIC))
            return float(_plain(obj(Tensor(step0, int32)))) / loss_scale
        return float(_plain(obj)) / loss_scale

    out = []
    for i, p in enumerate(params):
        lr_obj = opt.learning_rate[i] if opt.is_group_lr else opt.learning_rate
        k = schedule_of(lr_obj)
        wd_obj = opt.weight_decay[i] if opt.is_group else opt.weight_decay
        wd = wd_value(wd_obj) if opt.decay_flags[i] else 0.0
        rule, amsgrad, maximize = _rule(family, schedules[k].rates[0] if schedules[k].rates else 0.0, wd, settings)
        out.append((p, ParamUpdate(p.name, rule, amsgrad, maximize, k, i)))
    gc_flags = tuple(getattr(opt, "grad_centralization_flags", ()) or ())
    extra: dict[str, Any] = {"loss_scale": loss_scale, "notes": tuple(dict.fromkeys(notes)),
                             "grad_centralization": [p for p, f in zip(params, gc_flags) if f]}
    return out, tuple(schedules), extra


def _legacy_schedule(lr_obj: Any, step0: int, steps: int) -> Schedule:
    """A legacy learning rate: a Parameter (constant), a wrapped constant, a dynamic list (its entries from the
    optimizer's current global_step) or a LearningRateSchedule cell evaluated at each global_step."""
    from mindspore import Tensor, int32

    kind = type(lr_obj).__name__
    if kind == "_ConvertToCell":
        lr_obj = lr_obj.learning_rate
        kind = type(lr_obj).__name__
    if kind == "_IteratorLearningRate":
        values = _plain(lr_obj.learning_rate)
        values = values if isinstance(values, tuple) else (values,)
        return Schedule(words(Say.OPT_LR_LIST, count=len(values)),
                        tuple(float(v) for v in values[step0:step0 + steps]), len(values) - step0)
    if hasattr(lr_obj, "construct") and kind != "Parameter":
        return Schedule(f"{kind} (evaluated at global_step)",
                        tuple(float(_plain(lr_obj(Tensor(step0 + t, int32)))) for t in range(steps)))
    return Schedule("constant", (float(_plain(lr_obj)),) * steps)


def _read_groups(opt: Any, entry: OptimizerClass | None, scheduler: Any, steps: int
                 ) -> tuple[list[tuple[Any, ParamUpdate]], tuple[Schedule, ...], dict[str, Any]]:
    """mint / experimental optimizers: torch-style `param_groups`; the rate from the group key the update applies."""
    lr_key = entry.lr_key if entry else "lr"
    applied = [float(_plain(g.get(lr_key, g["lr"]))) for g in opt.param_groups]
    extra: dict[str, Any] = {}
    if scheduler is None:
        schedules = tuple(Schedule("constant", (lr,) * steps) for lr in applied)
    elif lr_key != "lr":
        schedules = tuple(Schedule(words(Say.OPT_CONSTANT_IGNORED), (lr,) * steps)
                          for lr in applied)
        extra.update(scheduler=type(scheduler).__name__, scheduler_ignored=True)
    else:
        schedules = _mindspore_scheduler(opt, scheduler, steps)
        extra["scheduler"] = type(scheduler).__name__
    family = entry.family if entry else Family.SGD
    out = []
    for gi, group in enumerate(opt.param_groups):
        settings = {k: _read(spec, group, True) for k, spec in _reads(entry).items()}
        rule, amsgrad, maximize = _rule(family, applied[gi], _plain(group.get("weight_decay", 0.0)), settings)
        out += [(p, ParamUpdate(p.name, rule, amsgrad, maximize, gi, gi)) for p in group["params"]]
    return out, schedules, extra


def _mindspore_scheduler(opt: Any, scheduler: Any, steps: int) -> tuple[Schedule, ...]:
    """Step a copy of a MindSpore LRScheduler that has its own counter and rates (the user's is left as it was)."""
    from mindspore import Parameter, Tensor, float32

    name = type(scheduler).__name__
    driven: Any = getattr(scheduler, "optimizer", None)
    if driven is not opt:
        raise AlignerError(f"the MindSpore scheduler {name} does not drive the MindSpore optimizer given with it")
    if not hasattr(scheduler, "_last_lr") or not hasattr(scheduler, "last_epoch"):
        raise AlignerError(f"the MindSpore scheduler {name} is not an LRScheduler the audit can step (it needs a "
                           "metric or wraps others)")
    clone = copy.copy(scheduler)
    clone.last_epoch = Parameter(Tensor(float(_plain(scheduler.last_epoch)), float32), name="audit_last_epoch")
    clone._last_lr = [Parameter(Tensor(float(_plain(lr)), float32), name=f"audit_lr_{i}")
                      for i, lr in enumerate(scheduler._last_lr)]
    rates: list[list[float]] = [[] for _ in clone._last_lr]
    for _ in range(steps):
        for i, lr in enumerate(clone._last_lr):
            rates[i].append(float(_plain(lr)))
        clone.step()
    return tuple(Schedule(name, tuple(r)) for r in rates)
