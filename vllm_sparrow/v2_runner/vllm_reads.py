"""What the V2 runner's glue relies on in vLLM (its releases: releases.py), declared as rows of the kind patches.py's
table uses (patch_helper.Read): the plugin looks for every one on the installed vLLM before it
registers the method (a required one missing: it steps aside, saying which), and
tools/vllm_source_check.py finds them in a release's source. Nothing here is patched.

A "signature" row is a method this glue overrides or calls: its parameters must be the names the
row lists, so a renamed argument or a removed hook in a later release is caught before it serves.
"""

from __future__ import annotations

from .. import shared_reads
from ..patch_helper import Read
from ..releases import V2, versions

VERSIONS = versions(V2)  # every row's releases, unless it names its own (a hook one release renamed)
_CONFIGS = "vllm.v1.worker.gpu.spec_decode.speculator_config"
_BASE = f"{_CONFIGS}.SpeculatorConfig"
_SPEC = "vllm.config.speculative.SpeculativeConfig"


def _read(target: str, by: str, reason: str, check: str, vllm_versions: tuple[str, ...] = VERSIONS, **kw) -> Read:
    return Read(target, by, reason, check, vllm_versions=vllm_versions, **kw)


METHOD_ROWS: tuple[Read, ...] = (
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

_SPECULATORS = "vllm.v1.worker.gpu.spec_decode.speculator"
_DRAFT = f"{_SPECULATORS}.DraftModelSpeculator"
_ESTIMATOR = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator.OnlineAcceptanceEstimator"
_BATCH = "vllm.v1.worker.gpu.input_batch.InputBatch"
_STATES = "vllm.v1.worker.gpu.states.RequestState"
_GLUE = "v2_runner/speculator.py"
_STEP = "v2_runner/step_inputs.py"
_PROPOSE = ("input_batch", "attn_metadata", "slot_mappings", "last_hidden_states", "aux_hidden_states",
            "num_sampled", "num_rejected", "last_sampled", "next_prefill_tokens", "temperature", "seeds",
            "dp_sync_state", "dummy_run", "skip_attn_for_dummy_run", "mm_inputs", "is_profile",
            "num_speculative_tokens")


def _hook(name: str, params: tuple[str, ...], reason: str, owner: str = f"{_SPECULATORS}.BaseSpeculator",
          vllm_versions: tuple[str, ...] = VERSIONS) -> Read:
    """A hook the glue overrides or calls; a release that renames it is a second row, each row
    naming its own releases (vllm_versions)."""
    return _read(f"{owner}.{name}", _GLUE, reason, "signature", params=params, vllm_versions=vllm_versions)


SPECULATOR_ROWS: tuple[Read, ...] = (
    # the speculator's base and the hooks it overrides (the runner's calls of them)
    _read(_DRAFT, _GLUE, "subclassed: the runner calls load_model(target) only for DraftModelSpeculator", "class"),
    _hook("__init__", ("vllm_config", "device"), "called by the subclass's constructor", _DRAFT),
    _hook("load_draft_model", ("target_model", "target_attn_layer_names"),
          "overridden: loads the Sparrow draft with the target's embedding and LM head", _DRAFT),
    _hook("propose", _PROPOSE, "overridden: one draft step"),
    _hook("add_request", ("req_index",), "overridden: a request joined (preempted ones released)"),
    _hook("on_requests_finished", ("finished_req_ids",), "overridden: frees finished requests' slots"),
    _hook("reset_state", (), "overridden: frees every slot after vLLM's warm-up"),
    _hook("init_cudagraph_manager", ("cudagraph_mode",), "overridden: the draft's graphs are its own"),
    _hook("capture", (), "overridden: captures the decode step's graphs"),
    _read("vllm.v1.worker.gpu.spec_decode.init_speculator", _GLUE,
          "passes req_states to a speculator whose constructor takes it (read in its source)", "class"),
    # what the DraftModelSpeculator base sets up
    _read(f"{_DRAFT}.draft_tokens", _GLUE, "[max_num_reqs, K] int64: the drafts returned", "instance"),
    _read(f"{_DRAFT}.draft_logits", _GLUE, "the DraftLogitsCache of probabilistic verification, or None",
          "instance"),
    _read(f"{_DRAFT}.num_speculative_steps", _GLUE, "K", "instance"),
    _read(f"{_DRAFT}.max_num_reqs", _GLUE, "max_num_seqs", "instance"),
    _read(f"{_DRAFT}.speculative_config", _GLUE, "the draft directory and speculator_options", "instance"),
    _read("vllm.v1.worker.gpu.spec_decode.draft_logits.DraftLogitsCache.values", _GLUE,
          "[max_num_reqs, K, vocab] what the rejection sampler reads as each draft's distribution "
          "(softmax(values / T))", "instance"),
    # adaptive verification: the confidences the runner's budget reads, written through vLLM's estimator
    _read(f"{_DRAFT}.use_acceptance_estimator", _GLUE, "adaptive verification is on (the estimator is made "
          "by the glue, before its graphs are captured, and the base class told not to make another)", "instance"),
    _read(f"{_DRAFT}.acceptance_estimator", _GLUE, "the estimator the runner's observe_verification refits", "instance"),
    _read(f"{_DRAFT}.draft_token_confidence_probs", _GLUE, "[max_num_reqs, K] float32 by batch row: what the "
          "runner's adaptive verification reads after propose()", "instance"),
    _read(f"{_DRAFT}.idx_mapping", _GLUE, "[max_num_reqs] slot per batch row, -1 past the batch (persistent)",
          "instance"),
    _read(f"{_DRAFT}.temperature", _GLUE, "[max_num_reqs] temperature by slot (persistent)", "instance"),
    _read(f"{_ESTIMATOR}.__init__", "v2_runner/speculator.py", "made by the glue", "signature",
          params=("max_num_reqs", "num_speculative_steps", "device")),
    _read(f"{_ESTIMATOR}.predict", "v2_runner/confidences.py", "each chained position's confidences from its "
          "draft logits", "signature", params=("logits", "idx_mapping", "draft_step", "confidence_probs",
                                               "temperature")),
    _read(f"{_ESTIMATOR}.slope", "v2_runner/confidences.py", "started at 1 (the draft's own probabilities)",
          "instance"),
    _read(f"{_ESTIMATOR}.intercepts", "v2_runner/confidences.py", "started at 0", "instance"),
    # the request states: the prompt's tokens on the host when a request joins, its prompt length
    _read(f"{_STATES}.add_request", _GLUE, "wrapped on the runner's own object (not the class): each new "
          "request's prompt tokens, to record its visual placeholder spans", "signature",
          params=("req_id", "prompt_len", "all_token_ids", "num_computed_tokens", "max_tokens")),
    _read(f"{_STATES}.req_id_to_index", _GLUE, "live requests (a tracked one absent was preempted)", "instance"),
    _read(f"{_STATES}.index_to_req_id", _GLUE, "the request a slot was given to", "instance"),
    _read(f"{_STATES}.prompt_len", _STEP, "prompt lengths by slot (its .np: the host copy)", "instance"),
    _read("vllm.v1.worker.gpu.buffer_utils.UvaBackedTensor.np", _STEP, "the host copy of prompt_len", "instance"),
    # the step
    *(_read(f"{_BATCH}.{f}", _STEP, why, "field") for f, why in (
        ("req_ids", "the batch's requests"), ("num_reqs", "B"), ("num_tokens", "T: rows without padding"),
        ("idx_mapping", "[B] request-state slot per batch row (device)"), ("idx_mapping_np", "the same, host"),
        ("query_start_loc", "[B + 1] row offsets (device)"), ("query_start_loc_np", "the same, host"),
        ("seq_lens", "[B] computed + scheduled tokens (device)"),
        ("num_computed_tokens_np", "[B] tokens computed before the step (host; an upper bound)"),
        ("has_prefill", "some request runs its prefill: the packed layout"),
        ("input_ids", "[T] the tokens the target ran"))),
    # engine_stats.py: the drafter's accounting, through LLM.collective_rpc
    _read("vllm.v1.worker.gpu.model_runner.GPUModelRunner.speculator", "engine_stats.py",
          "the worker's speculator, whose sparrow_stats() engine_stats reads", "instance"),
)

_VIDEO = "vllm.multimodal.video"
_LOADER = "v2_runner/pyav_loader.py"
VIDEO_ROWS: tuple[Read, ...] = (
    _read(f"{_VIDEO}.VIDEO_LOADER_REGISTRY", _LOADER, "registers the \"pyav\" loader (chosen by video_backend)",
          "class"),
    _read(f"{_VIDEO}.VideoLoaderRegistry.register", _LOADER, "the registry's public decorator", "signature",
          params=("name", "video_processor", "requires_gpu")),
    _read(f"{_VIDEO}.VideoLoader", _LOADER, "subclassed by the pyav loader", "class"),
    _read(f"{_VIDEO}.VideoLoader.load_bytes", _LOADER, "overridden: what VideoMediaIO calls with the server's "
          "and the request's video options", "signature", params=("data", "kwargs")),
    _read(f"{_VIDEO}.VideoLoader.compute_frames_index_to_sample", _LOADER, "the `sampling` loader's frame choice",
          "signature", params=("source", "target", "kwargs")),
    _read(f"{_VIDEO}.VideoLoader._prepare_source", _LOADER, "the `sampling` loader's source adjustment (Qwen3-VL: "
          "unknown fps)", "signature", params=("source",)),
    _read(f"{_VIDEO}.VideoLoader.create_hf_metadata", _LOADER, "the `sampling` loader's metadata", "signature",
          params=("source", "valid_frame_indices", "video_backend")),
    _read("vllm.multimodal.video_decoders.VideoSourceMetadata", _LOADER, "total frames, fps, duration", "class"),
    _read("vllm.multimodal.video_decoders.VideoTargetMetadata", _LOADER, "num_frames, fps, max_duration", "class"),
)

ROWS: tuple[Read, ...] = METHOD_ROWS + SPECULATOR_ROWS + VIDEO_ROWS + shared_reads.ROWS  # + what the shared modules read


def table_markdown() -> str:
    """The V2 runner's part of the docs' list of vLLM touches (docs/vllm-patches.md)."""
    rows = ["## The V2 runner's reads (its releases, vllm_sparrow/releases.py: the method registers through vLLM's "
            "registry, nothing is patched)", "", "Looked for before the method registers (v2_runner/vllm_reads.py); a "
            "`signature` row lists the parameters the glue overrides or calls the method with; `releases`: all of "
            "the V2 runner's, or the ones a row names.", "",
            "| reads | checked as | parameters | releases | read by | for |", "|---|---|---|---|---|---|"]
    for r in ROWS:
        params = "-" if r.params is None else ", ".join(r.params) or "(none)"
        where = "all" if r.vllm_versions in (VERSIONS, ()) else ", ".join(r.vllm_versions)
        rows.append(f"| `{r.target}` | {r.check} | {params} | {where} | {r.by} | {r.reason} |")
    return "\n".join(rows) + "\n"
