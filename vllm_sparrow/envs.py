"""Every SPARROW_* environment variable the plugin reads: one table, read through this module.

    from vllm_sparrow import envs
    envs.SPARROW_DRAFT_GRAPHS    # None (unset), "off" or "eager", parsed from os.environ now

`VARIABLES` maps each name to its parser, the value an unset (or blank) variable has, and the
text docs/serving.md shows for it (`python -m vllm_sparrow.envs docs/serving.md` rewrites that
list; a test keeps it equal to this table and checks that no other module reads a SPARROW_
variable from os.environ). Nothing is cached: each access reads os.environ, so a variable set
after import (a test's monkeypatch, the CLI before it starts an engine) counts, and a bad value
raises its ValueError, naming the variable and what it accepts, when the code that uses it reads
it (most at engine start-up), not at import.

Overrides of a draft-config value (SPARROW_STOP_CONFIDENCE, SPARROW_TREE_*) are None when unset,
so the draft's config.json decides, and the string "off" when turned off: None alone could not
tell "not set" from "set to off".

Read, not owned: RANK, WORLD_SIZE, LOCAL_RANK (torchrun's; cli.py, training/train.py),
TRITON_INTERPRET (Triton's; attention.py) and VLLM_MAX_IMAGE_PIXELS (vLLM's; video.py) are read
where they are used, as their owners define them; vLLM's VLLM_ENABLE_V1_MULTIPROCESSING is set
here, around the opening of an engine whose steps are timed (engine_core_in_this_process), and
so is VLLM_CPU_KVCACHE_SPACE where the user left it unset (cpu_kv_cache_unless_set).
SETUP_VARIABLES belong to `make setup` (Makefile, tools/setup_env.sh); the package never reads
them (releases.py names SPARROW_VLLM in the message of the choice it checks for the setup).

Standard library only (no torch, no vLLM), so any module may import it; kernels/ import nothing
from the package and read no variable.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

SETUP_VARIABLES = ("SPARROW_DEVICE", "SPARROW_FORCE_SETUP", "SPARROW_VLLM")  # tools/setup_env.sh's own


@dataclass(frozen=True)
class Variable:
    parse: Callable[[str, str], Any]  # (name, raw text) -> value; raises ValueError naming the variable
    default: Any  # the value when unset or blank
    values: str  # what it accepts (docs)
    unset: str  # what happens when it is not set (docs)
    help: str  # what it does (docs)
    read_in: tuple[str, ...]  # the modules that read it (paths under vllm_sparrow/; a test checks)


# ---- parsers: (name, raw) -> value -------------------------------------------------------------
def _choice(*allowed: str) -> Callable[[str, str], str]:
    """One of `allowed`, case and surrounding blanks ignored."""
    def parse(name: str, raw: str) -> str:
        text = raw.strip().lower()
        if text not in allowed:
            options = " or ".join(f"'{a}'" for a in allowed)
            raise ValueError(f"{name}={text!r}: use {options} (or leave it unset)")
        return text
    return parse


def _number_or_off(kind: type, ok: Callable[[float], bool], what: str) -> Callable[[str, str], Any]:
    """A number of `kind` that `ok` accepts (`what` says which, in messages), or "off"."""
    def parse(name: str, raw: str):
        text = raw.strip().lower()
        if text == "off":
            return "off"
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"{name}={text!r}: use {what} or 'off'") from None
        if not ok(value):
            raise ValueError(f"{name}={value}: use {what} or 'off'")
        return value
    return parse


_whole_or_off = _number_or_off(int, lambda v: v >= 1, "a whole number >= 1")
_probability_or_off = _number_or_off(float, lambda v: 0.0 < v < 1.0, "a probability in (0, 1)")
_seconds_or_off = _number_or_off(float, lambda v: v >= 0.0, "a number of seconds >= 0")


def _names(name: str, raw: str) -> frozenset[str]:
    """Comma-separated names; which of them mean something is for the reader (patches.py) to say."""
    return frozenset(n.strip() for n in raw.split(",") if n.strip())


def _exactly_one(name: str, raw: str) -> bool:
    """True for "1" exactly; any other value is as if unset (as it always was)."""
    return raw == "1"


def _pid_or_none(name: str, raw: str) -> int | None:
    """A pid; a value that is not a number is as if unset: the parent-death guard never raises."""
    try:
        return int(raw)
    except ValueError:
        return None


def _kill_at(name: str, raw: str) -> tuple[int, str]:
    """"N" or "N:text" -> (N, text); text "" matches every file."""
    n, _, text = raw.partition(":")
    try:
        return int(n), text
    except ValueError:
        raise ValueError(f"{name}={raw!r}: use N or N:text, N a whole number (the N-th durable write)") from None


def _path(name: str, raw: str) -> str:
    return raw.strip()


# ---- the table ---------------------------------------------------------------------------------
VARIABLES: dict[str, Variable] = {
    "SPARROW_STOP_CONFIDENCE": Variable(
        _probability_or_off, None, "a probability in (0, 1), or `off`",
        "the draft's `stop_confidence` (config.json; off if absent)",
        "adaptive length: each request's chain stops where the product of its drafted tokens' draft "
        "probabilities falls below it (greedy drafting; CUDA graphs off then)", ("drafting/choice.py",)),
    "SPARROW_TREE_TOPK": Variable(
        _whole_or_off, None, "a whole number >= 1, or `off`", "the draft's `tree_topk` (off if absent)",
        "tree search inside the draft: children scored per node and nodes kept per level (1 or `off`: "
        "the greedy chain)", ("drafting/choice.py",)),
    "SPARROW_TREE_BUDGET": Variable(
        _whole_or_off, None, "a whole number >= the tree's topk, or `off`",
        "the draft's `tree_budget` (if absent, as `off`)",
        "nodes the tree search may expand per request and step; `off`: topk nodes at every level",
        ("drafting/choice.py",)),
    "SPARROW_DRAFT_GRAPHS": Variable(
        _choice("off", "eager"), None, "`off`, `eager`",
        "follow vLLM's switches (`enforce_eager`, `cudagraph_mode`, tensor parallelism)",
        "CUDA graphs of the decode draft step: `off` turns them off alone; `eager` runs the same "
        "static-buffer step without capture, on any device (tests)", ("drafting/choice.py",)),
    "SPARROW_ATTENTION_BACKEND": Variable(
        _choice("torch", "triton"), None, "`torch`, `triton`", "`triton` on CUDA, `torch` elsewhere",
        "the draft's window attention; `triton` off CUDA only under `TRITON_INTERPRET=1` (tests)",
        ("attention.py",)),
    "SPARROW_DRAFT_VOCAB": Variable(
        _choice("full"), None, "`full`",
        "the draft's reduced vocabulary, where its directory has `draft_vocab.safetensors`",
        "`full` drafts over the whole vocabulary, ignoring the reduced one", ("draft_vocab.py",)),
    "SPARROW_ALLOW_OTHER_VERIFIER": Variable(
        _exactly_one, False, "`1` (any other value: as unset)",
        "a draft made for another verifier is refused at start-up",
        "`1` serves a draft whose config names another verifier (architecture, depth, weights) anyway",
        ("checkpoint.py",)),
    "SPARROW_HOST_MEMORY_RELEASE": Variable(
        _seconds_or_off, None, "seconds (a number >= 0), or `off`", "every 5 s at the most",
        "how often, at the most, the serving worker hands the C allocator's free pages back to the OS "
        "when requests end (host_memory.py: keeps its resident memory flat under load); `off` never",
        ("serving_draft.py",)),
    "SPARROW_DISABLE_PATCHES": Variable(
        _names, frozenset(), "names of general vLLM fixes, comma separated", "every fix is applied",
        "general vLLM fixes to leave out (docs/vllm-patches.md); any other name is logged and ignored",
        ("patches.py",)),
    "SPARROW_PARENT_PID": Variable(
        _pid_or_none, None, "a process id (set by the `sparrow` command, not by hand)",
        "no `sparrow` command above this process: no parent-death guard",
        "the `sparrow` command whose engine processes must die with it, kill -9 included",
        ("lifetime.py",)),
    "SPARROW_KILL_AT_WRITE": Variable(
        _kill_at, None, "`N` or `N:text`", "off",
        "test hook: SIGKILL half way through the process's N-th durable write (to files whose name "
        "contains text)", ("durable.py",)),
    "SPARROW_HOLD_REPLICA": Variable(
        _path, None, "a file path", "off",
        "test hook: the first Ray replica to take a batch creates this file, writes its pid and its items "
        "into it and waits with the batch (up to 10 minutes) to be killed", ("ray_jobs/replicas.py",)),
}


# Per-engine knobs that vLLM 0.34 also takes as `speculative_config.speculator_options` (the option
# is the variable's name, lower case, without SPARROW_; an option given there wins over the variable).
ENGINE_OPTIONS: dict[str, str] = {name.removeprefix("SPARROW_").lower(): name for name in (
    "SPARROW_STOP_CONFIDENCE", "SPARROW_TREE_TOPK", "SPARROW_TREE_BUDGET", "SPARROW_DRAFT_GRAPHS",
    "SPARROW_ATTENTION_BACKEND", "SPARROW_DRAFT_VOCAB", "SPARROW_HOST_MEMORY_RELEASE")}


def parse_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """speculator_options parsed as their variables are ({"stop_confidence": 0.3} -> {"SPARROW_STOP_
    CONFIDENCE": 0.3}); an unknown option or a bad value raises ValueError saying what is accepted."""
    out = {}
    for key, value in (options or {}).items():
        if key not in ENGINE_OPTIONS:
            raise ValueError(f"speculator_options {key!r} is not a Sparrow option: use "
                             f"{', '.join(sorted(ENGINE_OPTIONS))}")
        name = ENGINE_OPTIONS[key]
        try:
            out[name] = VARIABLES[name].parse(f"speculator_options.{key}", str(value))
        except ValueError as e:
            raise ValueError(f"{e} ({VARIABLES[name].values})") from None
    return out


_OPTIONS: dict[str, Any] = {}  # engine_options' overrides, by variable name


@contextlib.contextmanager
def engine_options(parsed: dict[str, Any]):
    """Within the block, the variables given as speculator_options (parse_options' result) read as
    those values: the V2 runner's speculator loads its draft inside it, so one engine's options
    never leak into another engine of the process."""
    global _OPTIONS
    saved, _OPTIONS = _OPTIONS, dict(parsed)
    try:
        yield
    finally:
        _OPTIONS = saved


def read(name: str) -> Any:
    """The variable's value now: a speculator option given for the engine being set up, else its
    default when unset or blank, else what its parser makes of it."""
    if name in _OPTIONS:
        return _OPTIONS[name]
    var = VARIABLES[name]
    raw = os.environ.get(name, "")
    return var.default if not raw.strip() else var.parse(name, raw)


def export(name: str, value: Any) -> None:
    """Set a variable of the table in this process's environment, which the processes it starts
    inherit (lifetime.record_command: SPARROW_PARENT_PID)."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a variable of vllm_sparrow.envs.VARIABLES")
    os.environ[name] = str(value)


def __getattr__(name: str) -> Any:
    # Module attribute access (PEP 562): envs.SPARROW_X reads os.environ at every access.
    if name in VARIABLES:
        return read(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *VARIABLES])


@contextlib.contextmanager
def engine_core_in_this_process() -> Iterator[None]:
    """vLLM's VLLM_ENABLE_V1_MULTIPROCESSING=0 while an engine is opened in the block (vLLM reads
    it when LLM is made): its engine core then runs inside engine.step(), so a measurement that
    times engine.step() (sparrow tune) times the step itself. With the core in its own process,
    vLLM's default, the core steps on its own and step() only collects what is already made
    (measured: 0.0 ms per step)."""
    name = "VLLM_ENABLE_V1_MULTIPROCESSING"
    saved = os.environ.get(name)
    os.environ[name] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


@contextlib.contextmanager
def cpu_kv_cache_unless_set(gib: int) -> Iterator[None]:
    """vLLM's VLLM_CPU_KVCACHE_SPACE=gib while engines are opened in the block, unless the user set
    it (theirs wins). Only vLLM's CPU backend reads it. Unset, that backend sizes the KV cache from
    the free memory and refuses to start when less than its share is free: `sparrow tune` opens
    one engine after another, and on a 24 GiB machine the second float32 engine was refused
    (21.67 of 21.7 GiB asked free). A fixed cache takes no such check."""
    name = "VLLM_CPU_KVCACHE_SPACE"
    if os.environ.get(name, "").strip():
        yield
        return
    os.environ[name] = str(gib)
    try:
        yield
    finally:
        os.environ.pop(name, None)


# ---- what a Ray replica gets from its driver -----------------------------------------------------
FOR_WORKERS = ("SPARROW_", "VLLM_", "HF_", "TRANSFORMERS_")  # name prefixes
# a pid on this machine (each replica records its own), a test's hook for this process, and the
# variables that name this machine's address
NOT_FOR_WORKERS = ("SPARROW_PARENT_PID", "SPARROW_KILL_AT_WRITE", "VLLM_HOST_IP", "VLLM_PORT")


@contextlib.contextmanager
def hooks_hidden() -> Iterator[None]:
    """This process's environment without the test hook SPARROW_KILL_AT_WRITE within the block:
    a local Ray cluster's processes, started then (ray.init), inherit the environment, and the
    hook is meant for this process alone (a test killing the command at its N-th write)."""
    saved = os.environ.pop("SPARROW_KILL_AT_WRITE", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["SPARROW_KILL_AT_WRITE"] = saved


def for_workers() -> dict[str, str]:
    """This process's variables that the Ray replicas of its job are given (ray_jobs/cluster.py,
    as runtime_env env_vars): the plugin's knobs, vLLM's and Hugging Face's settings, as set here."""
    return {k: v for k, v in os.environ.items() if k.startswith(FOR_WORKERS) and k not in NOT_FOR_WORKERS}


# ---- docs --------------------------------------------------------------------------------------
BLOCK = re.compile(r"(<!-- generated: envs -->\n)(.*?)(<!-- /generated -->)", re.S)


def table_markdown() -> str:
    """docs/serving.md's list of environment variables, generated from VARIABLES."""
    rows = ["| variable | values | unset | what it does | read in |", "|---|---|---|---|---|"]
    for name, v in VARIABLES.items():
        read_in = ", ".join(f"`{m}`" for m in v.read_in)
        rows.append(f"| `{name}` | {v.values} | {v.unset} | {v.help} | {read_in} |")
    return "\n".join(rows) + "\n"


def rewrite_block(text: str) -> str:
    """text with its `<!-- generated: envs -->` block made anew from the table."""
    return BLOCK.sub(lambda m: m[1] + table_markdown() + m[3], text)


if __name__ == "__main__":  # python -m vllm_sparrow.envs [FILE]: print the table, or rewrite FILE's block
    if len(sys.argv) > 1:
        with open(sys.argv[1], encoding="utf-8") as f:
            old = f.read()
        with open(sys.argv[1], "w", encoding="utf-8") as f:
            f.write(rewrite_block(old))
    else:
        print(table_markdown(), end="")
