"""The patch helper: the two kinds of row of the one table (patches.PATCHES) and the recording
replacement every patch goes through.

A `Declared` row replaces an attribute of vLLM (or sets a mapping entry); a `Read` row replaces
nothing and names an internal of vLLM that Sparrow reads, or a method it overrides in a subclass.
A row applies on every supported vLLM version unless it names its versions (`for_version`).
`replace_attr` and `set_entry` check that a patch touches the attribute its row declares and that
no other patch holds that attribute, and record the original so `revert_patches` can undo it.
The rows are declared beside the code they serve (v1_runner/method_patches.py,
vllm_reads.py, vllm_fixes.py; v2_runner/vllm_reads.py); patches.py joins them into the table, fills DECLARED and applies them. This
module imports nothing from vLLM or from the rest of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar


@dataclass(frozen=True)
class Declared:
    """A patch: what is replaced, where, why, for whom."""

    kind: ClassVar[str] = "replaces"
    name: str
    target: str  # the attribute replaced (or the mapping entry set), as a dotted path
    scope: str  # "sparrow": the method needs it; "fix": a general vLLM fix or addition
    platform: str  # "any" or "cpu"
    reason: str
    apply: Callable[[], None]  # shared by rows that must be applied together
    needs: tuple[str, ...] = ()  # fixes this one builds on (turning one off turns this off)
    vllm_versions: tuple[str, ...] = ()  # the vLLM versions it applies to; empty: every supported one


# How the start-up check finds a read's target on the installed vLLM:
CHECKS = {
    "class": "class or module attribute (hasattr)",
    "field": "dataclass field",
    "instance": "instance attribute: assigned (self.<name> = ...) in the code of the class or a base",
    "signature": "a method Sparrow overrides, and its parameters' names (the call the runner makes of it)",
    "documented": "not checked: documented only",
}


def parameter_names(names) -> tuple[str, ...]:
    """A method's parameter names without its leading self or cls (a classmethod read from its
    class has none; its source does)."""
    names = tuple(names)
    return names[1:] if names[:1] in (("self",), ("cls",)) else names


@dataclass(frozen=True)
class Read:
    """An internal of vLLM that Sparrow relies on without replacing it: read, or overridden in
    SparrowProposer. The start-up check (patches.missing_reads) looks for it as `check` says."""

    kind: ClassVar[str] = "reads"
    target: str  # dotted path: module.Class.attribute (or module.attribute)
    by: str  # who reads it: a module of the package, or a patch by name
    reason: str  # what Sparrow reads it for
    check: str  # a key of CHECKS
    required: bool = True  # missing: the plugin steps aside (else the reader falls back; logged)
    platform: str = "any"  # "any", "cpu" or "cuda"
    needs: tuple[str, ...] = ()  # the general fix that reads it (turned off: not checked)
    vllm_versions: tuple[str, ...] = ()  # the vLLM versions it applies to; empty: every supported one
    params: tuple[str, ...] | None = None  # check "signature": the method's parameter names, self or cls left out

    def __post_init__(self) -> None:
        if self.check not in CHECKS:
            raise ValueError(f"read {self.target}: check {self.check!r} is not one of {', '.join(CHECKS)}")
        if (self.check == "signature") != (self.params is not None):
            raise ValueError(f"read {self.target}: params go with check 'signature', and it needs them")

    @property
    def name(self) -> str:
        return self.target

    @property
    def scope(self) -> str:
        return "fix" if self.needs else "sparrow"


def for_version(row: Declared | Read, version: str) -> bool:
    """Whether a row applies on vLLM `version` (X.Y.Z): a row whose target moved between the
    supported versions is declared once per version, each naming its own."""
    return not row.vllm_versions or version in row.vllm_versions


@dataclass
class Patch:
    name: str
    owner: Any
    attr: str
    original: Any
    target: str  # dotted path actually patched (checked against the declaration)


DECLARED: dict[str, Declared | Read] = {}  # name -> row; filled by patches.py from its table
APPLIED: dict[str, Patch] = {}
_HELD: dict[tuple[int, str], str] = {}  # (id(owner), attr) -> the patch holding it


def record(name: str, owner: Any, attr: str, original: Any, target: str) -> None:
    """Record that patch `name` replaces owner.attr (dotted path `target`); refuse an undeclared
    patch, one that touches another attribute than its row says, and a second patch of one
    attribute."""
    declared = DECLARED.get(name)
    if declared is None or declared.kind != "replaces":
        raise RuntimeError(f"vllm-sparrow patch {name!r} is not declared in patches.PATCHES")
    if target != declared.target:
        raise RuntimeError(f"vllm-sparrow patch {name!r} touches {target}, but declares {declared.target}")
    if name in APPLIED:
        raise RuntimeError(f"vllm-sparrow patch {name!r} applied twice")
    holder = _HELD.get((id(owner), attr))
    if holder is not None:
        raise RuntimeError(f"vllm-sparrow patches {holder!r} and {name!r} both replace {target}")
    _HELD[(id(owner), attr)] = name
    APPLIED[name] = Patch(name, owner, attr, original, target)


def dotted_path(owner: Any) -> str:
    if hasattr(owner, "__qualname__"):
        return f"{owner.__module__}.{owner.__qualname__}"
    return owner.__name__  # a module


def replace_attr(name: str, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
    """Replace owner.attr by make(original), recording it; conflicts are refused."""
    original = getattr(owner, attr)
    record(name, owner, attr, original, f"{dotted_path(owner)}.{attr}")
    setattr(owner, attr, make(original))


def set_entry(name: str, mapping: dict, where: str, key: str, value: Any) -> None:
    """Set mapping[key] = value (annotations, registries; `where` names the mapping), recording
    the old entry."""
    record(name, mapping, key, mapping.get(key), f"{where}[{key!r}]")
    mapping[key] = value


def revert_patches() -> None:
    """Undo every recorded patch, newest first (a failed apply_patches leaves vLLM as it was)."""
    for patch in reversed(list(APPLIED.values())):
        if isinstance(patch.owner, dict):
            if patch.original is None:
                patch.owner.pop(patch.attr, None)
            else:
                patch.owner[patch.attr] = patch.original
        else:
            setattr(patch.owner, patch.attr, patch.original)
    APPLIED.clear()
    _HELD.clear()
