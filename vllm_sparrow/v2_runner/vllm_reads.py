"""What the V2 runner's glue relies on in vLLM 0.34, declared as rows of the kind patches.py's
table uses (patch_helper.Read): the plugin looks for every one on the installed vLLM before it
registers the method (a required one missing: it steps aside, saying which), and
tools/vllm_source_check.py finds them in a release's source. Nothing here is patched.

A "signature" row is a method this glue overrides or calls: its parameters must be the names the
row lists, so a renamed argument or a removed hook in a later release is caught before it serves.
"""

from __future__ import annotations

from ..patch_helper import Read

VERSIONS = ("0.34.0",)
_CONFIGS = "vllm.v1.worker.gpu.spec_decode.speculator_config"
_BASE = f"{_CONFIGS}.SpeculatorConfig"
_SPEC = "vllm.config.speculative.SpeculativeConfig"


def _read(target: str, by: str, reason: str, check: str, **kw) -> Read:
    return Read(target, by, reason, check, vllm_versions=VERSIONS, **kw)


ROWS: tuple[Read, ...] = (
    _read(f"{_CONFIGS}.register_speculative_method", "v2_runner/method.py",
          "registers \"sparrow\" with its config class", "signature", params=("name", "config_cls")),
    _read(f"{_BASE}.configure", "v2_runner/method.py",
          "overridden: validates the draft and fills its depth in as vLLM builds the SpeculativeConfig",
          "signature", params=("spec",)),
    _read(f"{_BASE}.apply_options", "v2_runner/method.py", "overridden: refuses bad speculator_options",
          "signature", params=("spec",)),
    _read(f"{_BASE}.speculator_class", "v2_runner/method.py", "names the speculator vLLM builds", "class"),
    _read(f"{_BASE}.supported_options", "v2_runner/method.py", "lets speculator_options through", "class"),
    _read(f"{_BASE}.uses_target_hidden_states", "v2_runner/method.py",
          "the runner hands the target's hidden states to propose()", "class"),
    _read(f"{_SPEC}.speculator_options", "v2_runner/method.py", "Sparrow's per-engine options", "field"),
    _read(f"{_SPEC}.custom_method", "v2_runner/method.py", "where vLLM keeps the registered name", "field"),
    _read(f"{_SPEC}.target_model_config", "method_config.py", "the target, to validate the draft against",
          "field"),
    _read(f"{_SPEC}.target_parallel_config", "method_config.py", "pipeline_parallel_size, refused above 1",
          "field"),
    _read(f"{_SPEC}.num_speculative_tokens_per_batch_size", "method_config.py",
          "per-batch-size depths, checked against the draft's trained depth; the draft's own schedule when "
          "the user gives none", "field"),
)
