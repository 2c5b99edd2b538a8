"""The optimizer catalogue (mappings/optimizers.yaml): what each optimizer class is, in one place.

Each class's update formula (`Family`), the constructor arguments that set each setting (`use_nesterov`,
`learning_rate`, `beta1`/`beta2`), where a live instance keeps them, the state a checkpoint holds (slots, scalars,
step counter) and whether its update is torch's (`legacy`, with why); which formula pairs differ and how much.
`align convert --optimizer`, `align diff --grads` and `align audit` read it from here; `OptimizerKind` (the classes
whose state `align convert` carries over) is built from it. docs/optimizers.md: how to add a class.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
from typing import TYPE_CHECKING, Any

from aligner.core.errors import AlignerError
from aligner.core.findings import Severity
from aligner.core.frameworks import Framework
from aligner.core.rules import ANY, ListOf, MapOf, OneOf, Opt, load_rules

CATALOGUE_FILE = "optimizers.yaml"
LAYOUTS = ("momentum", "adam")   # the state an update keeps: one buffer per parameter, or two moments


class Family(str, enum.Enum):
    """An update formula (the JSON value is the string); the catalogue describes each, update_rule simulates each."""

    SGD = "SGD"
    ADAM = "Adam"
    ADAMW = "AdamW"
    MS_ADAM = "MindSpore nn.Adam"
    MS_ADAM_WEIGHT_DECAY = "MindSpore nn.AdamWeightDecay"

    def __str__(self) -> str:
        return self.value

    @property
    def spec(self) -> FamilySpec:
        return catalogue().families[self]

    @property
    def adaptive(self) -> bool:
        """An Adam variant (betas and eps matter)."""
        return self.spec.adaptive

    @property
    def decoupled(self) -> bool:
        """Whether weight decay shrinks the weights directly (AdamW) rather than being added to the gradient (L2)."""
        return self.spec.decoupled


_SETTINGS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "betas", "eps", "amsgrad", "maximize")
_SLOTS = ("momentum", "exp_avg", "exp_avg_sq")
SCHEMA = {
    "families": MapOf({"layout": OneOf(*LAYOUTS), "adaptive": bool, "decoupled": bool,
                       "mindspore_class": Opt(str), "why": Opt(str)}, keys=Family),
    "classes": MapOf({
        "class": str, "import": str, "framework": OneOf(Framework.PYTORCH.value, Framework.MINDSPORE.value),
        "family": Family, "convert": Opt(str), "legacy": Opt(bool), "api": OneOf("groups", "nn"),
        "args": {s: Opt(OneOf(str, ListOf(str))) for s in _SETTINGS},
        "read": {s: Opt(OneOf(str, ListOf(str), {"const": ANY})) for s in _SETTINGS},
        "lr": Opt(str), "decoupled_if": Opt(str),
        "state": {"slots": {s: Opt(str) for s in _SLOTS}, "amsgrad": Opt(str), "extra": Opt(ListOf(str)),
                  "scalars": Opt(ListOf(str)), "step": Opt(str), "step_offset": Opt(int)},
        "why": Opt(str)}),
    "pairs": ListOf({"pytorch": ListOf(Family), "mindspore": ListOf(Family), "severity": Severity, "why": str}),
}


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """One update formula: the state it keeps, whether adaptive / decoupled, torch's MindSpore twin or how it
    differs from torch's."""

    layout: str
    adaptive: bool
    decoupled: bool
    mindspore_class: str | None = None
    why: str = ""


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """What a checkpoint of the class holds: neutral slot -> torch key / MindSpore prefix, the amsgrad maximum's key,
    other per-parameter prefixes, MindSpore scalars, the step key and its offset from the updates taken."""

    slots: dict[str, str]
    amsgrad: str | None = None
    extra: tuple[str, ...] = ()
    scalars: tuple[str, ...] = ()
    step: str | None = None
    step_offset: int = 0


@dataclasses.dataclass(frozen=True)
class OptimizerClass:
    """One optimizer class of the catalogue (see mappings/optimizers.yaml for each field)."""

    short: str                            # how messages and fixes name it: nn.Momentum, torch.optim.AdamW
    qualname: str                         # type(optimizer)'s module.name
    import_path: str                      # how a user constructs it: mindspore.nn.Momentum
    framework: Framework
    family: Family
    api: str                              # groups | nn
    args: dict[str, str | tuple[str, ...]]
    read: dict[str, Any]
    state: StateSpec
    convert: str | None = None            # its OptimizerKind spelling, when align convert carries its state
    legacy: bool = False
    why: str = ""
    lr_key: str = "lr"
    decoupled_if: str | None = None

    @property
    def layout(self) -> str:
        return self.family.spec.layout

    def argument(self, setting: str) -> str | tuple[str, ...] | None:
        """The constructor argument that sets `setting` (torch's name), None when the class has none."""
        return self.args.get(setting)


@dataclasses.dataclass(frozen=True)
class FormulaPair:
    """A torch family and a MindSpore family whose updates differ: how badly, and why ({ratio}, {eps_factor})."""

    pytorch: tuple[Family, ...]
    mindspore: tuple[Family, ...]
    severity: Severity
    why: str


@dataclasses.dataclass(frozen=True)
class Catalogue:
    """The whole file: formulas, classes (file order) and the formula pairs that differ."""

    families: dict[Family, FamilySpec]
    classes: tuple[OptimizerClass, ...]
    pairs: tuple[FormulaPair, ...]

    @functools.cached_property
    def by_qualname(self) -> dict[str, OptimizerClass]:
        return {c.qualname: c for c in self.classes}

    @functools.cached_property
    def by_kind(self) -> dict[str, OptimizerClass]:
        return {c.convert: c for c in self.classes if c.convert}

    def named(self, short: str) -> OptimizerClass:
        return next(c for c in self.classes if c.short == short)

    def named_import(self, import_path: str) -> OptimizerClass:
        return next(c for c in self.classes if c.import_path == import_path)

    def pair(self, torch_family: Family, ms_family: Family) -> FormulaPair | None:
        """The first pair naming both families (None: the updates are the same)."""
        if torch_family is ms_family:
            return None
        return next((p for p in self.pairs if torch_family in p.pytorch and ms_family in p.mindspore), None)


def _class(short: str, data: dict[str, Any]) -> OptimizerClass:
    state = data["state"]
    return OptimizerClass(
        short, data["class"], data["import"], Framework(data["framework"]), Family(data["family"]), data["api"],
        {k: tuple(v) if isinstance(v, list) else v for k, v in data["args"].items()}, dict(data["read"]),
        StateSpec(dict(state["slots"]), state.get("amsgrad"), tuple(state.get("extra", ())),
                  tuple(state.get("scalars", ())), state.get("step"), int(state.get("step_offset", 0))),
        data.get("convert"), bool(data.get("legacy", False)), " ".join(data.get("why", "").split()),
        data.get("lr", "lr"), data.get("decoupled_if"))


def _consistent(cat: Catalogue) -> None:
    """What the schema cannot say: every formula described, a legacy class says why, spellings unique, each
    torch formula's MindSpore twin is a catalogue class of that formula."""
    def fail(message: str) -> AlignerError:
        return AlignerError(f"{CATALOGUE_FILE}: {message}")

    missing = [f.value for f in Family if f not in cat.families]
    if missing:
        raise fail(f"no entry for the update formula(s) {', '.join(missing)} under families")
    shorts = [c.short for c in cat.classes]
    kinds = [c.convert for c in cat.classes if c.convert]
    for names, what in ((shorts, "class name"), (kinds, "convert spelling")):
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise fail(f"{what} {twice[0]!r} given twice")
    for c in cat.classes:
        if c.legacy != bool(c.why):
            raise fail(f"classes.{c.short}: a legacy class says why (and only a legacy class)")
        if c.convert and (c.convert.partition(":")[0] == "torch") != (c.framework is Framework.PYTORCH):
            raise fail(f"classes.{c.short}: convert {c.convert!r} must start with torch: exactly for a torch class")
    for family, spec in cat.families.items():
        twin = spec.mindspore_class
        if twin is not None and not any(c.import_path == twin and c.family is family for c in cat.classes):
            raise fail(f"families.{family.value}: mindspore_class {twin} is no catalogue class of that formula")


@functools.cache
def catalogue() -> Catalogue:
    """The shipped catalogue, parsed and checked once."""
    data = load_rules(CATALOGUE_FILE, SCHEMA)
    families = {Family(name): FamilySpec(f["layout"], f["adaptive"], f["decoupled"], f.get("mindspore_class"),
                                         " ".join(f.get("why", "").split()))
                for name, f in data["families"].items()}
    classes = tuple(_class(short, entry) for short, entry in data["classes"].items())
    pairs = tuple(FormulaPair(tuple(map(Family, p["pytorch"])), tuple(map(Family, p["mindspore"])),
                              Severity(p["severity"]), " ".join(p["why"].split())) for p in data["pairs"])
    cat = Catalogue(families, classes, pairs)
    _consistent(cat)
    return cat


class _Kind(str):
    """What each OptimizerKind member knows, all of it read from its catalogue entry."""

    value: str

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str.__str__(self), spec)

    @property
    def spec(self) -> OptimizerClass:
        return catalogue().by_kind[str.__str__(self)]

    @property
    def is_torch(self) -> bool:
        return self.spec.framework is Framework.PYTORCH

    @property
    def family(self) -> Family:
        return self.spec.family

    @property
    def layout(self) -> str:
        """'momentum' (one buffer per parameter) or 'adam' (first and second moments)."""
        return self.spec.layout

    @property
    def legacy(self) -> bool:
        """A MindSpore class whose update is not torch's (`spec.why` says how)."""
        return self.spec.legacy

    @property
    def decoupled(self) -> bool:
        return self.spec.family.decoupled

    @property
    def python_class(self) -> str:
        """The class a user constructs: torch.optim.SGD, mindspore.nn.Momentum, mindspore.mint.optim.AdamW."""
        return self.spec.import_path

    @classmethod
    def parse(cls, text: str, option: str = "--optimizer") -> Any:
        """From its spelling (`ms:Adam`, also `mindspore:Adam`), the class a user constructs (`mindspore.nn.Adam`) or
        its short name (`nn.Adam`), case-insensitive; one error naming the choices."""
        key = text.strip().lower()
        kinds: Any = cls     # the enum (this is its mixin)
        for kind in kinds:
            names = (kind.value, kind.value.replace("ms:", "mindspore:", 1), kind.python_class, kind.spec.short)
            if key in (n.lower() for n in names):
                return kind
        raise AlignerError(f"{option}: unknown optimizer {text!r} (supported: {', '.join(k.value for k in kinds)})")


def _member(spelling: str) -> str:
    """The enum member name of a spelling: torch:SGD -> TORCH_SGD, ms:AdamWeightDecay -> MS_ADAMWEIGHTDECAY."""
    return spelling.replace(":", "_").upper()


if TYPE_CHECKING:
    class OptimizerKind(_Kind, enum.Enum):
        """One optimizer class whose state align convert carries over, spelled `framework:Class` (a str enum)."""

        @classmethod
        def parse(cls, text: str, option: str = "--optimizer") -> OptimizerKind: ...
else:
    OptimizerKind = enum.Enum("OptimizerKind", {_member(k): k for k in catalogue().by_kind}, type=_Kind,
                              module=__name__, qualname="OptimizerKind")
    OptimizerKind.__str__, OptimizerKind.__format__ = _Kind.__str__, _Kind.__format__  # the spelling, as before
    OptimizerKind.__doc__ = ("One optimizer class whose state align convert carries over, spelled `framework:Class` "
                             "(a str enum built from the catalogue's `convert` spellings)")


def convertible(framework: Framework, family: Family) -> OptimizerKind:
    """The one class of `framework` computing `family` whose state align convert carries over."""
    return next(k for k in OptimizerKind if k.spec.framework == framework and k.family is family)


def same_state(a: OptimizerKind, b: OptimizerKind) -> bool:
    """Whether two MindSpore classes keep exactly the same checkpoint keys (mint Adam and AdamW): a checkpoint
    cannot tell them apart."""
    sa, sb = a.spec.state, b.spec.state
    return not a.is_torch and not b.is_torch and (sa.slots, sa.scalars) == (sb.slots, sb.scalars)


__all__ = ["Catalogue", "Family", "FamilySpec", "FormulaPair", "OptimizerClass", "OptimizerKind", "StateSpec",
           "catalogue", "convertible", "same_state"]
