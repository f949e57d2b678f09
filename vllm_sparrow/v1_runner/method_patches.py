"""The Sparrow method's patches of vLLM: what `method: "sparrow"` needs to exist in vLLM 0.32.

vLLM 0.32 has no registry of speculative methods, so "sparrow" is added to it here. Sparrow runs
as an EAGLE-family method (the runner hands it the target's hidden states), with its own proposer
object (proposer.py) and its own text-only cache; vLLM allocates no draft KV cache for it.

Each patch is declared in ROWS beside its code, with the internals its code reads; patches.py
joins ROWS into the one table and applies it (none of these can be turned off).
"""

from __future__ import annotations

import functools
from typing import Callable

from ..patch_helper import Declared, Read, dotted_path, record, replace_attr, set_entry

METHOD = "sparrow"


# ---- config: "sparrow" is a speculative method ---------------------------------------------
def _patch_speculative_config() -> None:
    from typing import Literal

    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config import speculative as spec_mod

    cls = spec_mod.SpeculativeConfig
    extended = Literal[spec_mod.SpeculativeMethod, Literal[METHOD]] | None  # type: ignore[valid-type]
    # pydantic validates against the dataclass field type, so both must change before rebuild.
    set_entry("speculative-method-literal", cls.__annotations__, f"{dotted_path(cls)}.__annotations__", "method",
              extended)
    cls.__dataclass_fields__["method"].type = extended
    replace_attr("speculative-post-init", cls, "__post_init__", _wrap_post_init)
    replace_attr("use-eagle", cls, "use_eagle", _wrap_use_eagle)
    rebuild_dataclass(cls, force=True)


def _wrap_post_init(original: Callable) -> Callable:
    @functools.wraps(original)
    def __post_init__(self) -> None:
        if self.method != METHOD:
            from ..checkpoint import refuse_sparrow_draft_under

            refuse_sparrow_draft_under(self.method, self.model)  # a Sparrow draft needs method sparrow
            return original(self)
        from ..method_config import prepare

        _refuse_model_runner_v2()
        prepare(self)  # the draft validated against the target, its depth filled in
        # Upstream's EAGLE path builds draft_model_config (reading the speculators-format
        # config.json through the "sparrow" algo registered below) and the parallel config.
        self.method = "eagle"
        try:
            original(self)
        finally:
            self.method = METHOD

    return __post_init__


def _refuse_model_runner_v2() -> None:
    """VLLM_USE_V2_MODEL_RUNNER=1 skips the unsupported-features list that keeps sparrow on the V1
    runner (row v2-runner-fallback): MRV2 would then build vLLM's own EAGLE speculator for the
    Sparrow draft, which cannot load it (docs/model-runner-v2.md)."""
    from vllm import envs

    from ..config import DraftConfigError

    if envs.VLLM_USE_V2_MODEL_RUNNER:
        raise DraftConfigError("the sparrow method runs on vLLM's V1 model runner, but VLLM_USE_V2_MODEL_RUNNER=1 "
                               "forces Model Runner V2: unset VLLM_USE_V2_MODEL_RUNNER (or set it to 0) to serve "
                               "with sparrow")


def _wrap_use_eagle(original: Callable) -> Callable:
    @functools.wraps(original)
    def use_eagle(self) -> bool:
        return self.method == METHOD or original(self)

    return use_eagle


def _patch_async_scheduling_method() -> None:
    from typing import Literal

    from vllm.config import vllm as vllm_config_mod

    extended = Literal[vllm_config_mod.EagleModelTypes, Literal[METHOD]]  # type: ignore[valid-type]
    set_entry("async-scheduling-method", vars(vllm_config_mod), "vars(vllm.config.vllm)", "EagleModelTypes", extended)


def _patch_v2_fallback() -> None:
    from vllm.config.vllm import VllmConfig

    def make(original):
        @functools.wraps(original)
        def unsupported(self) -> list[str]:
            found = original(self)
            spec = self.speculative_config
            if spec is not None and spec.method == METHOD:
                found.append(f"speculative method '{METHOD}' (vllm-sparrow runs on the V1 runner)")
            return found

        return unsupported

    replace_attr("v2-runner-fallback", VllmConfig, "_get_v2_model_runner_unsupported_features", make)


# ---- runner: the proposer object and the release of finished requests -----------------------
def _patch_eagle_proposer() -> None:
    from vllm.v1.spec_decode.eagle import EagleProposer

    def make(original):
        def __new__(cls, vllm_config, *args, **kwargs):
            spec = vllm_config.speculative_config
            if cls is EagleProposer and spec is not None and spec.method == METHOD:
                from .proposer import SparrowProposer

                cls = SparrowProposer
            return object.__new__(cls) if original is object.__new__ else original(cls)

        return __new__

    replace_attr("eagle-proposer-new", EagleProposer, "__new__", make)


def _patch_runner_release() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def make(original):
        @functools.wraps(original)
        def _update_states(self, scheduler_output):
            drafter = getattr(self, "drafter", None)
            if drafter is not None and hasattr(drafter, "release_requests"):
                gone = set(scheduler_output.finished_req_ids)
                gone |= set(scheduler_output.preempted_req_ids or ())
                if gone:
                    drafter.release_requests(gone)
            return original(self, scheduler_output)

        return _update_states

    replace_attr("runner-release-requests", GPUModelRunner, "_update_states", make)


# ---- checkpoints: the draft directory is a speculators config of a registered model ---------
def _register_speculators_algo() -> None:
    from vllm.transformers_utils.configs.speculators import algos

    def update_sparrow(config_dict: dict, pre_trained_config: dict) -> None:
        # The draft layer is Llama-shaped; its Sparrow fields ride along on the config.
        for key in ("target_hidden_size", "anchor_tokens", "window_tokens", "ivsb_layer"):
            pre_trained_config[key] = config_dict.get(key)

    set_entry("speculators-algo", algos.SUPPORTED_SPECULATORS_TYPES, f"{algos.__name__}.SUPPORTED_SPECULATORS_TYPES",
              METHOD, update_sparrow)


def _register_draft_architecture() -> None:
    from vllm import ModelRegistry

    from ..config import DRAFT_ARCHITECTURE

    if DRAFT_ARCHITECTURE in ModelRegistry.get_supported_archs():
        raise RuntimeError(f"vllm-sparrow: architecture {DRAFT_ARCHITECTURE} registered twice")
    record("draft-architecture", ModelRegistry.models, DRAFT_ARCHITECTURE, None,
           f"vllm.ModelRegistry.models[{DRAFT_ARCHITECTURE!r}]")
    ModelRegistry.register_model(DRAFT_ARCHITECTURE, "vllm_sparrow.model:SparrowDraftModel")


# ---- the rows -----------------------------------------------------------------------------
_SPEC = "vllm.config.speculative.SpeculativeConfig"
_RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
_SCHEDULED = "vllm.v1.core.sched.output.SchedulerOutput"
ROWS: tuple[Declared | Read, ...] = (
    Declared("speculative-method-literal", f"{_SPEC}.__annotations__['method']", "sparrow", "any",
             "SpeculativeConfig.method accepts \"sparrow\" (pydantic rebuild)", _patch_speculative_config),
    Declared("speculative-post-init", f"{_SPEC}.__post_init__", "sparrow", "any",
             "validates the Sparrow draft against the target, then runs upstream's EAGLE set-up for it",
             _patch_speculative_config),
    Read(f"{_SPEC}.target_model_config", "speculative-post-init",
         "the target's config, to validate the draft against it", "field"),
    Read(f"{_SPEC}.target_parallel_config", "speculative-post-init",
         "pipeline_parallel_size, refused above 1", "field"),
    Read(f"{_SPEC}.num_speculative_tokens_per_batch_size", "speculative-post-init",
         "per-batch-size depths, checked against the draft's trained depth; set from the draft's own schedule "
         "(sparrow tune) when the user gives no depth (read with getattr: absent is none)",
         "field", required=False),
    Read("vllm.envs.VLLM_USE_V2_MODEL_RUNNER", "speculative-post-init",
         "set to 1 it forces Model Runner V2, where Sparrow does not run: refused with what to do", "class"),
    Declared("use-eagle", f"{_SPEC}.use_eagle", "sparrow", "any",
             "True for sparrow: hidden states reach the drafter, lookahead slots, drafter wiring",
             _patch_speculative_config),
    Declared("async-scheduling-method", "vars(vllm.config.vllm)['EagleModelTypes']", "sparrow", "any",
             "the async-scheduling check accepts sparrow as it does EAGLE (the drafter reads nothing back "
             "from the device; the CPU platform turns async scheduling off for every method anyway)",
             _patch_async_scheduling_method),
    Declared("v2-runner-fallback", "vllm.config.vllm.VllmConfig._get_v2_model_runner_unsupported_features",
             "sparrow", "any", "Model Runner V2 lists sparrow as unsupported, so vLLM uses the V1 runner "
             "(Sparrow's proposer is a V1 EagleProposer)", _patch_v2_fallback),
    Declared("eagle-proposer-new", "vllm.v1.spec_decode.eagle.EagleProposer.__new__", "sparrow", "any",
             "EagleProposer(...) builds a SparrowProposer for method sparrow", _patch_eagle_proposer),
    Declared("runner-release-requests", f"{_RUNNER}._update_states",
             "sparrow", "any", "tells the drafter which requests finished, were aborted or preempted, so their "
             "draft cache slots are freed", _patch_runner_release),
    Read(f"{_RUNNER}.drafter", "runner-release-requests; engine_stats.py",
         "the runner's proposer (a SparrowProposer): told of released requests; asked for its stats", "instance"),
    Read(f"{_SCHEDULED}.finished_req_ids", "runner-release-requests", "requests finished or aborted", "field"),
    Read(f"{_SCHEDULED}.preempted_req_ids", "runner-release-requests", "requests preempted", "field"),
    Declared("speculators-algo",
             "vllm.transformers_utils.configs.speculators.algos.SUPPORTED_SPECULATORS_TYPES['sparrow']",
             "sparrow", "any", "the speculators config registry reads \"sparrow\" checkpoints",
             _register_speculators_algo),
    Declared("draft-architecture", "vllm.ModelRegistry.models['SparrowDraftModel']", "sparrow", "any",
             "vLLM's ModelConfig accepts the draft directory (SparrowProposer loads it)",
             _register_draft_architecture),
)
