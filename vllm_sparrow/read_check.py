"""The start-up checks both glues run before anything registers: the installed vLLM's version
against releases.py, and each internal a glue reads (patch_helper.Read rows) looked for on the
installed vLLM's objects, as the row's `check` says (patch_helper.CHECKS). patches.py runs them
for the V1 runner's table, v2_runner/method.py for the V2 runner's reads;
tools/vllm_source_check.py finds the same rows in a release's source without installing it.
"""

from __future__ import annotations

import dis
import importlib
import inspect
import types
from typing import Any

from .patch_helper import Declared, Read, for_version, parameter_names
from .releases import install_hint, listed, release, versions


class UnsupportedVllmVersion(RuntimeError):
    pass


class MissingVllmInternals(UnsupportedVllmVersion):
    """The installed vLLM lacks an internal Sparrow reads (a vLLM changed in place)."""


def check_vllm_version() -> str:
    """The installed vLLM's version ("0.34.0"), if releases.py lists it; else UnsupportedVllmVersion."""
    import vllm

    version = vllm.__version__.split("+")[0]
    if release(version) is None:
        raise UnsupportedVllmVersion(
            f"vllm-sparrow supports vLLM {supported_versions_text()} only, found {vllm.__version__}. {install_hint()}")
    return version


def supported_versions_text() -> str:
    """"0.32.0, 0.33.0 and 0.34.0": the supported versions, for messages."""
    return listed(versions())


def on_this_platform(row: Declared | Read) -> bool:
    if row.platform == "any":
        return True
    from vllm.platforms import current_platform

    return {"cpu": current_platform.is_cpu, "cuda": current_platform.is_cuda}[row.platform]()


# ---- the reads -------------------------------------------------------------
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


def rows_for(rows, version: str) -> list:
    """The rows of `rows` that apply on vLLM `version` and this platform (patch_helper.for_version)."""
    return [r for r in rows if for_version(r, version) and on_this_platform(r)]
