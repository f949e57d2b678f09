"""Every touch of vLLM internals, in one place: one declared table, checked and applied once per
process.

`PATCHES` is the V1 runner's table (its releases: releases.py), joined from the rows each module of its
glue (v1_runner/) declares beside its code:
  method_patches.py  the Sparrow method's patches (the method "sparrow" in vLLM's config, its
                     proposer, the release of finished requests, its checkpoints); required
  vllm_reads.py      internals the method's modules read (or override in SparrowProposer)
                     without patching them: the runner's batch, the attention metadata, ...
  vllm_fixes.py      general vLLM fixes met on the way, each of which SPARROW_DISABLE_PATCHES=name,...
                     turns off
  verify_fixes.py    general fixes of vLLM's verify step: request parameters that break with any
                     speculative method (turned off the same way)
and the reads of the modules both glues share (shared_reads.py, in the V2 runner's table too).
A row is a patch (patch_helper.Declared, kind "replaces") or a read (patch_helper.Read, kind
"reads", which replaces nothing). `apply_patches()` checks the vLLM version (one of
releases.py's), then that every read of this platform and version is present on the
installed vLLM (a required one missing: nothing is applied, as on another version), then applies the patches; the replacement helper checks that each
touches the attribute its row declares and that no other patch holds that attribute. The checks
are read_check.py's, which the V2 runner's glue (v2_runner/, which patches nothing) runs on its
reads too; glues.py says which table each release is checked by and prints the docs' list
(`python -m vllm_sparrow.glues`, docs/vllm-patches.md); tools/vllm_source_check.py finds every row
in a vLLM release's source without installing it.
"""

from __future__ import annotations

from . import LOGGER, envs
from . import shared_reads
from .v1_runner import method_patches, verify_fixes, vllm_fixes, vllm_reads
from .patch_helper import APPLIED, CHECKS, DECLARED, Declared, Patch, Read, for_version, revert_patches
from .read_check import (MissingVllmInternals, UnsupportedVllmVersion, check_vllm_version, missing_reads,
                         on_this_platform)
from .releases import V1, release, versions

__all__ = ["APPLIED", "DECLARED", "PATCHES", "Declared", "Patch", "Read", "apply_patches", "revert_patches",
           "table_markdown"]

logger = None  # set by apply_patches (vLLM logger, imported lazily)

PATCHES: tuple[Declared | Read, ...] = (method_patches.ROWS + vllm_reads.ROWS + shared_reads.ROWS + vllm_fixes.ROWS
                                        + verify_fixes.ROWS)
DECLARED.update((row.name, row) for row in PATCHES)


def apply_patches() -> None:
    if APPLIED:
        return  # idempotent: the plugin entry point runs in every vLLM process
    version = check_vllm_version()
    if release(version).runner != V1:
        raise UnsupportedVllmVersion(
            f"the patch table is for vLLM's V1 model runner ({', '.join(versions(V1))}); on vLLM {version} "
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


# ---- the docs' list --------------------------------------------------------------------------
def table_markdown() -> str:
    """The V1 runner's part of the docs' list of vLLM touches (docs/vllm-patches.md, glues.py
    joins the parts), generated from PATCHES."""
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
    return "\n".join(rows) + "\n"


def _where(row: Declared | Read) -> str:
    """The platform column: the platform, and the vLLM versions of a row made for some only."""
    return row.platform + (f" (vLLM {', '.join(row.vllm_versions)})" if row.vllm_versions else "")


def _module(fn) -> str:
    return fn.__module__.replace(".", "/") + ".py"
