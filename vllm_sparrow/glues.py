"""The two runners' glues side by side: which files each one is, which table of vLLM touches a
release is checked by, and the docs' list of both tables.

  V1 runner  v1_runner/   patches.PATCHES: patches and reads, applied by patches.apply_patches
  V2 runner  v2_runner/   v2_runner/vllm_reads.ROWS: reads only, looked for by v2_runner/method.register
The rest of the package is shared by both; its reads (shared_reads.py) are in both tables.
Read by tools/vllm_source_check.py (a release's source against its glue's table and imports) and
printed as docs/vllm-patches.md's tables (`python -m vllm_sparrow.glues`). Nothing below imports it.
"""

from __future__ import annotations

from . import patches
from .patch_helper import Declared, Read
from .releases import V1, V2, release
from .v2_runner import vllm_reads as v2_reads

FOLDERS = {V1: "vllm_sparrow/v1_runner/", V2: "vllm_sparrow/v2_runner/"}


def glue_of(path: str) -> str | None:
    """V1, V2 or None (shared) for a file of the package, as a path from the repository root."""
    return next((runner for runner, folder in FOLDERS.items() if path.startswith(folder)), None)


def table_for(version: str) -> tuple[Declared | Read, ...]:
    """The rows vLLM `version`'s glue is checked by (all of them; patch_helper.for_version picks a
    release's own)."""
    r = release(version)
    if r is None:
        raise ValueError(f"vLLM {version} is not in releases.py")
    return v2_reads.ROWS if r.runner == V2 else patches.PATCHES


def docs_markdown() -> str:
    """Both tables as docs/vllm-patches.md lists them."""
    return patches.table_markdown() + "\n" + v2_reads.table_markdown()


if __name__ == "__main__":
    print(docs_markdown(), end="")
