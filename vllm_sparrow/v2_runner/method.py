"""The "sparrow" speculative method of vLLM 0.34's registry (Model Runner V2).

vLLM reads the registered config class in every process (front end, engine core, workers): when
it builds the SpeculativeConfig (`configure`, `apply_options`) and, each time it asks how the
speculator behaves, through `spec.speculator_config`. So this module imports only vLLM's config
module and the plugin's own light modules; the speculator itself is named by its qualified name.

    --speculative-config '{"method": "sparrow", "model": "DRAFT",
                           "speculator_options": {"stop_confidence": 0.3}}'

`model` is the draft directory, read by the plugin alone (vLLM parses no config of it: the draft
model config is the target's, as for a method without a draft checkpoint); `num_speculative_tokens`
is the draft's own depth when not given. `speculator_options` takes Sparrow's per-engine knobs
(envs.ENGINE_OPTIONS: the SPARROW_* variable of the same name, which it overrides).
"""

from __future__ import annotations

from typing import ClassVar

from vllm.v1.worker.gpu.spec_decode.speculator_config import SpeculatorConfig

from .. import LOGGER, envs
from ..method_config import prepare

METHOD = "sparrow"
SPECULATOR = "vllm_sparrow.v2_runner.speculator.SparrowSpeculator"


class SparrowSpeculatorConfig(SpeculatorConfig):
    speculator_class: ClassVar[str | None] = SPECULATOR
    supported_options: ClassVar[frozenset[str]] = frozenset({"speculator_options"})
    # The runner hands propose() the target's final hidden states, and schedules no prefill chunk
    # to end within one token of the prompt's end (the draft pairs each state with the next token).
    uses_target_hidden_states: ClassVar[bool] = True

    @classmethod
    def configure(cls, spec) -> None:
        super().configure(spec)  # the draft model config is the target's; no checkpoint is parsed
        prepare(spec)

    @classmethod
    def apply_options(cls, spec) -> None:
        envs.parse_options(spec.speculator_options)  # refused here, in the front end, with what to use


def register(version: str | None = None) -> None:
    """Registers the method in this process (the plugin's entry point calls it in every one, with
    the installed release; None: read it here), once every internal the glue relies on in that
    release is found on the installed vLLM (vllm_reads.py: the rows of this release and platform)."""
    import vllm
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    from ..read_check import MissingVllmInternals, missing_reads, rows_for
    from .vllm_reads import ROWS

    rows = rows_for(ROWS, (version or vllm.__version__).split("+")[0])
    absent = missing_reads(rows)
    missing = [r for r in absent if r.required]
    if missing:
        raise MissingVllmInternals(
            "vllm-sparrow relies on vLLM internals this vLLM lacks: "
            + "; ".join(f"{r.target} (read by {r.by})" for r in missing) + ". Reinstall vLLM as released.")
    register_speculative_method(METHOD, SparrowSpeculatorConfig)
    from . import pyav_loader

    pyav_loader.register()  # the "pyav" video loader (--media-io-kwargs '{"video": {"video_backend": "pyav"}}')
    from vllm import __version__
    from vllm.logger import init_logger

    init_logger(LOGGER).info("vllm-sparrow: method %r registered through vLLM %s's registry of speculative methods "
                             "(Model Runner V2 glue, vllm_sparrow/v2_runner/), and the %r video loader; nothing of "
                             "vLLM patched; %d vLLM internals it reads found", METHOD, __version__, pyav_loader.NAME,
                             sum(r.check != "documented" for r in rows) - len(absent))
