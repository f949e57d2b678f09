"""General fixes of vLLM's verify step (its rejection sampler, V1 runner): request parameters that
work without speculation and break with any speculative method, vLLM's own eagle included.
Declared in ROWS beside their code, joined into the one table by patches.py, each can be turned
off by name (SPARROW_DISABLE_PATCHES).

logprob_token_ids (SamplingParams.logprob_token_ids; the OpenAI server's `logprob_token_ids`):
the logprobs of token ids the request names, at every output position. vLLM 0.32/0.33's rejection
sampler hands the request's ids to its bonus-token sampler, whose output then holds the named
ids' logprobs where the verify step expects the bonus rows' whole logits, and it gathers the
accepted tokens' top-k instead of the named ids: the request fails (HTTP 500; streamed, an error
event "list index out of range"), even at max_tokens=1. Here the bonus sampler runs without the
ids, and the named ids' logprobs are gathered from the rows the top-k would be, by the function
the step without speculation uses (Sampler.gather_specific_token_logprobs), so they are the
no-speculation step's.

Named ids beside top-k logprobs in one batch: vLLM 0.32/0.33's sampler, when any request of a
step names ids, answers every request of the step with the named ids' gather ("prefer
logprob_token_ids"), so a request asking `top_logprobs` batched beside one naming ids gets the
sampled token and padding (-9999 over HTTP) instead of its top-k, with speculation or without;
which requests meet depends on timing. Here each row gets what its request asked
(logprobs_per_request), in the plain sampler (fix `mixed-logprobs`) and in the verify step above,
as vLLM 0.34 answers them.

logit_bias and min_p: vLLM refuses both with any speculative method ("not yet supported with
speculative decoding", HTTP 400): under speculation it builds neither's logits processor, and its
verify step would apply neither to the drafted positions' rows (the bonus row goes through the
plain sampler, which would). For the sparrow method they are accepted, their processors built,
and they are applied as the plain sampler applies them: the bias added to each drafted
position's logits before the penalties (as the plain sampler orders it; the masks commute with
both), min_p cut after the temperature and before top-k / top-p. Rejection sampling against the
biased, cut distribution keeps the output that distribution's, whatever the draft proposed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from ..patch_helper import Declared, Read, replace_attr

_RS = "vllm.v1.sample.rejection_sampler"
# The step's {request index: named ids}, set on the rejection sampler while its forward runs: the
# upstream forward calls _get_logprobs_tensors without the sampling metadata.
_ASKED = "_sparrow_logprob_token_ids"


def _patch_verify_logprob_token_ids() -> None:
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    def make_forward(original: Callable) -> Callable:
        @functools.wraps(original)
        def forward(self, metadata, draft_probs, logits, sampling_metadata):
            asked = sampling_metadata.logprob_token_ids
            if not asked:
                return original(self, metadata, draft_probs, logits, sampling_metadata)
            # max_num_logprobs is set for such a request (SamplingParams.num_logprobs counts its
            # ids); 0 where a caller left it unset, so the accepted tokens' logprobs are computed
            plain = dataclasses.replace(sampling_metadata, logprob_token_ids=None,
                                        max_num_logprobs=sampling_metadata.max_num_logprobs or 0)
            setattr(self, _ASKED, asked)
            try:
                return original(self, metadata, draft_probs, logits, plain)
            finally:
                delattr(self, _ASKED)

        return forward

    def make_logprobs(original: Callable) -> Callable:
        @functools.wraps(original)
        def _get_logprobs_tensors(self, max_num_logprobs, metadata, logits, target_logits, bonus_logits,
                                  sampled_token_ids):
            asked = getattr(self, _ASKED, None)
            if asked is None:
                return original(self, max_num_logprobs, metadata, logits, target_logits, bonus_logits,
                                sampled_token_ids)
            return named_ids_logprobs(self, asked, max_num_logprobs, metadata, logits, target_logits, bonus_logits,
                                      sampled_token_ids)

        return _get_logprobs_tensors

    replace_attr("verify-logprob-token-ids", RejectionSampler, "forward", make_forward)
    replace_attr("verify-logprob-token-ids-rows", RejectionSampler, "_get_logprobs_tensors", make_logprobs)


def named_ids_logprobs(sampler, asked: dict[int, list[int]], num_topk: int, metadata, logits, target_logits,
                       bonus_logits, sampled_token_ids):
    """The logprobs of each request's named ids (and of its sampled token, column 0) at each of its
    output positions, as LogprobsTensors with one row per (request, position), request-major; a
    request that names none gets its position's `num_topk` most likely tokens instead.

    The verify step's logits rows: request r's drafts' rows, then its bonus row. With 2 requests
    drafting 2 and 1 tokens, logits rows are [d0 d1 b0 | d0 b1] and cu_num_sampled_tokens is
    [3, 5]; sampled_token_ids is [2, 3] (width = most drafts + 1), so the rows gathered are
    [0 1 2 | 3 4 4] (a position past a request's last is clamped, and parse_output drops it).
    """
    import torch
    from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID

    width = sampled_token_ids.shape[-1]  # most drafts + 1
    final = torch.zeros_like(logits, dtype=torch.float32)  # [num_tokens + batch, vocab]
    final[metadata.target_logits_indices] = target_logits.to(torch.float32)
    final[metadata.bonus_logits_indices] = bonus_logits.to(torch.float32)
    starts = torch.nn.functional.pad(metadata.cu_num_sampled_tokens[:-1], (1, 0))  # [batch] first row of each
    offsets = torch.arange(width, device=starts.device, dtype=starts.dtype)
    rows = (starts.unsqueeze(1) + offsets).flatten().clamp_(max=final.shape[0] - 1)  # [batch * width]
    tokens = sampled_token_ids.flatten().to(torch.int64)  # [batch * width]
    tokens = tokens.masked_fill(tokens == PLACEHOLDER_TOKEN_ID, 0)  # rejected positions: any valid id
    chosen = final[rows]  # [batch * width, vocab]
    logprobs = chosen if sampler.is_logits_logprobs_mode else sampler.sampler.compute_logprobs(chosen)
    per_row = {r * width + j: ids for r, ids in asked.items() for j in range(width)}
    return logprobs_per_request(logprobs, per_row, tokens, num_topk)


def logprobs_per_request(logprobs, named: dict[int, list[int]], sampled, num_topk: int):
    """LogprobsTensors of `logprobs` [rows, vocab] as each row's request asked: column 0 the sampled
    token's (sampled [rows]); then a row in `named` (row: ids) the named ids', and every other row
    its num_topk most likely tokens' (vLLM's gather_logprobs: torch.topk); columns past what a row
    asked hold id 0 at -inf (the output processor reads a request's first 1 + num_logprobs).
    Rows {0: [7, 9]} and num_topk 1: ids [[s0, 7, 9], [s1, top1, 0]], logprobs of the last -inf."""
    import torch
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than

    rows, device = logprobs.shape[0], logprobs.device
    num_topk = 0 if len(named) == rows else num_topk  # every row named: no top-k to compute
    width = 1 + max([num_topk, *map(len, named.values())])
    named_ids = torch.zeros(rows, width, dtype=torch.int64)  # [rows, width], built on the host
    named_valid = torch.zeros(rows, width, dtype=torch.bool)
    is_named = torch.zeros(rows, 1, dtype=torch.bool)
    for r, ids in named.items():
        named_ids[r, 1:1 + len(ids)] = torch.as_tensor(ids, dtype=torch.int64)
        named_valid[r, :1 + len(ids)] = True
        is_named[r] = True
    top_ids = torch.zeros(rows, width, dtype=torch.int64, device=device)  # [rows, width]
    top_valid = torch.zeros(rows, width, dtype=torch.bool, device=device)
    top_valid[:, :1 + num_topk] = True
    if num_topk:
        top_ids[:, 1:1 + num_topk] = torch.topk(logprobs, num_topk, dim=-1).indices
    is_named = is_named.to(device)
    ids = torch.where(is_named, named_ids.to(device), top_ids)
    valid = torch.where(is_named, named_valid.to(device), top_valid)
    ids[:, 0] = sampled
    values = logprobs.gather(-1, ids).masked_fill(~valid, float("-inf"))  # [rows, width]
    ranks = batched_count_greater_than(logprobs, values[:, :1])  # [rows], the sampled token's rank
    return LogprobsTensors(logprob_token_ids=ids.to(torch.int32), logprobs=values, selected_token_ranks=ranks)


_NUM_TOPK = "_sparrow_num_logprobs"  # the step's max_num_logprobs, set on the sampler while forward runs


def _patch_mixed_logprobs() -> None:
    from vllm.v1.sample.sampler import Sampler

    def make_forward(original: Callable) -> Callable:
        @functools.wraps(original)
        def forward(self, logits, sampling_metadata, *args, **kwargs):
            if not sampling_metadata.logprob_token_ids:
                return original(self, logits, sampling_metadata, *args, **kwargs)
            setattr(self, _NUM_TOPK, sampling_metadata.max_num_logprobs or 0)
            try:
                return original(self, logits, sampling_metadata, *args, **kwargs)
            finally:
                delattr(self, _NUM_TOPK)

        return forward

    def make_gather(original: Callable) -> Callable:
        @functools.wraps(original)
        def gather_specific_token_logprobs(self, logprobs, logprob_token_ids, sampled):
            num_topk = getattr(self, _NUM_TOPK, None)
            if not logprob_token_ids or num_topk is None:
                return original(self, logprobs, logprob_token_ids, sampled)
            return logprobs_per_request(logprobs, logprob_token_ids, sampled, num_topk)

        return gather_specific_token_logprobs

    replace_attr("mixed-logprobs", Sampler, "forward", make_forward)
    replace_attr("mixed-logprobs-rows", Sampler, "gather_specific_token_logprobs", make_gather)


def _patch_verify_logit_bias_min_p() -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.worker import gpu_model_runner

    replace_attr("verify-logit-bias-min-p", SamplingParams, "_validate_spec_decode", _accepting_for_sparrow)
    replace_attr("verify-logits-processors", gpu_model_runner, "build_logitsprocs", _building_the_builtins)
    replace_attr("verify-logit-bias-rows", rs.RejectionSampler, "apply_logits_processors", _biasing_drafted_rows)
    replace_attr("verify-min-p-rows", rs, "apply_sampling_constraints", _cutting_drafted_rows)


def _accepting_for_sparrow(original: Callable) -> Callable:
    import copy

    @functools.wraps(original)
    def _validate_spec_decode(self, speculative_config):
        if getattr(speculative_config, "method", None) != "sparrow" or not (self.min_p or self.logit_bias):
            return original(self, speculative_config)
        checked = copy.copy(self)  # upstream's other checks (if any) still run
        checked.min_p, checked.logit_bias = 0.0, None
        return original(checked, speculative_config)

    return _validate_spec_decode


def _building_the_builtins(original: Callable) -> Callable:
    @functools.wraps(original)
    def build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs=()):
        method = getattr(vllm_config.speculative_config, "method", None)
        if method != "sparrow" or is_pooling_model or custom_logitsprocs:
            return original(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs)
        # upstream builds min_tokens alone under speculation; the builtins, as without it
        from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors

        return LogitsProcessors(ctor(vllm_config, device, is_pin_memory) for ctor in BUILTIN_LOGITS_PROCESSORS)

    return build_logitsprocs


def _biasing_drafted_rows(original: Callable) -> Callable:
    @functools.wraps(original)
    def apply_logits_processors(self, logits, sampling_metadata, metadata):
        biases = _processor(sampling_metadata, "LogitBiasLogitsProcessor")
        if biases is not None and biases.biases:  # before upstream's penalties, as the plain sampler
            add_bias_per_drafted_row(logits, biases.biases, metadata.num_draft_tokens)
        return original(self, logits, sampling_metadata, metadata)

    return apply_logits_processors


def _cutting_drafted_rows(original: Callable) -> Callable:
    from vllm.v1.sample import rejection_sampler as rs

    @functools.wraps(original)
    def apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata):
        min_p = _processor(sampling_metadata, "MinPLogitsProcessor")
        if sampling_metadata.all_greedy or min_p is None or not min_p.min_p_count:
            return original(logits, cu_num_draft_tokens, sampling_metadata)
        # upstream's temperature alone, then min_p, then upstream's top-k / top-p
        top_k, top_p = sampling_metadata.top_k, sampling_metadata.top_p
        logits = original(logits, cu_num_draft_tokens, dataclasses.replace(sampling_metadata, top_k=None, top_p=None))
        num_tokens = logits.shape[0]

        def per_row(x):  # [batch] -> [num_tokens]
            return None if x is None else rs.expand_batch_to_tokens(x, cu_num_draft_tokens, num_tokens)

        cut_min_p(logits, per_row(min_p.min_p[:, 0]))
        if top_k is None and top_p is None:
            return logits
        return rs.apply_top_k_top_p(logits, per_row(top_k), per_row(top_p))

    return apply_sampling_constraints


def _processor(sampling_metadata, name: str):
    """The step's builtin logits processor of that class (vLLM builds one of each per engine)."""
    from vllm.v1.sample.logits_processor import builtin

    procs = sampling_metadata.logitsprocs
    return next((p for p in (*procs.non_argmax_invariant, *procs.argmax_invariant)
                 if isinstance(p, getattr(builtin, name))), None)


def add_bias_per_drafted_row(logits, biases: dict[int, dict[int, float]], num_draft_tokens: list[int]) -> None:
    """logits [num_drafted, vocab], request r's drafted positions in rows starting at the sum of
    the drafts before it; biases {request index: {token id: bias}}, added to each of its rows.
    Drafts [2, 1] and biases {1: {7: 5.0}}: logits[2, 7] += 5."""
    import torch

    starts = [0]
    for n in num_draft_tokens:
        starts.append(starts[-1] + n)
    rows, tokens, values = [], [], []
    for r, bias in biases.items():
        for row in range(starts[r], starts[r + 1]):
            rows += [row] * len(bias)
            tokens += list(bias)
            values += list(bias.values())
    if rows:
        at = (torch.tensor(rows, device=logits.device), torch.tensor(tokens, device=logits.device))
        logits.index_put_(at, torch.tensor(values, dtype=logits.dtype, device=logits.device), accumulate=True)


def cut_min_p(logits, min_p) -> None:
    """logits [rows, vocab] (after the temperature), min_p [rows]: the plain sampler's min_p cut, in
    place (tokens less likely than min_p times the row's most likely one get -inf)."""
    import torch

    probs = torch.softmax(logits, dim=-1)
    floor = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    logits.masked_fill_(probs < floor, float("-inf"))


_WHY = ("a request naming token ids whose logprobs it wants (logprob_token_ids) failed with any speculative "
        "method (HTTP 500; streamed, \"list index out of range\"): the bonus-token sampler returned the named ids' "
        "logprobs where the verify step reads whole rows; it runs without them, and the accepted tokens' logprobs "
        "are gathered at the named ids as without speculation")
_WHY_MIXED = ("a request asking top_logprobs got the sampled token and padding instead when a request naming "
              "token ids (logprob_token_ids) shared its step: the sampler answered the whole step with the named "
              "ids' gather; each row now gets what its request asked")
_WHY_BIAS = ("logit_bias and min_p were refused with speculative decoding (HTTP 400); for the sparrow method "
             "they are accepted and applied to every drafted position's row of the verify step as the plain "
             "sampler applies them (the bonus row's sampler already does), so output follows the biased, cut "
             "distribution")
_BIAS_PARTS = ("verify-logit-bias-min-p", "verify-logits-processors", "verify-logit-bias-rows", "verify-min-p-rows")
ROWS: tuple[Declared | Read, ...] = (
    # two attributes, one fix: turning either off turns off both; it gathers with mixed-logprobs'
    # logprobs_per_request, so turning that off turns it off too
    Declared("verify-logprob-token-ids", f"{_RS}.RejectionSampler.forward", "fix", "any", _WHY,
             _patch_verify_logprob_token_ids, needs=("verify-logprob-token-ids-rows", "mixed-logprobs")),
    Declared("verify-logprob-token-ids-rows", f"{_RS}.RejectionSampler._get_logprobs_tensors", "fix", "any",
             "the accepted tokens' logprobs gathered at the named ids (with verify-logprob-token-ids)",
             _patch_verify_logprob_token_ids, needs=("verify-logprob-token-ids", "mixed-logprobs")),
    Read(f"{_RS}.RejectionSampler.is_logits_logprobs_mode", "verify-logprob-token-ids",
         "logprobs reported as logits (vLLM's logprobs_mode)", "instance", needs=("verify-logprob-token-ids",)),
    Read(f"{_RS}.PLACEHOLDER_TOKEN_ID", "verify-logprob-token-ids", "a rejected position's token id", "class",
         needs=("verify-logprob-token-ids",)),
    # logprobs_per_request's reads: both fixes gather with it, and the verify one needs mixed-logprobs
    Read("vllm.v1.sample.ops.logprobs.batched_count_greater_than", "mixed-logprobs, verify-logprob-token-ids",
         "the sampled token's rank, as vLLM counts it", "class", needs=("mixed-logprobs",)),
    Read("vllm.v1.outputs.LogprobsTensors", "mixed-logprobs, verify-logprob-token-ids",
         "the logprobs handed to the output processor (ids, logprobs, ranks)", "class", needs=("mixed-logprobs",)),
    # two attributes, one fix
    Declared("mixed-logprobs", "vllm.v1.sample.sampler.Sampler.forward", "fix", "any", _WHY_MIXED,
             _patch_mixed_logprobs, needs=("mixed-logprobs-rows",)),
    Declared("mixed-logprobs-rows", "vllm.v1.sample.sampler.Sampler.gather_specific_token_logprobs", "fix", "any",
             "each row's named ids or top-k, as its request asked (with mixed-logprobs)", _patch_mixed_logprobs,
             needs=("mixed-logprobs",)),
    Read("vllm.v1.sample.metadata.SamplingMetadata.max_num_logprobs", "mixed-logprobs",
         "the most top-k logprobs a request of the step asks", "field", needs=("mixed-logprobs",)),
    Read("vllm.v1.sample.metadata.SamplingMetadata.logprob_token_ids", "verify-logprob-token-ids",
         "each request's named ids, by its index in the batch", "field", needs=("verify-logprob-token-ids",)),
    Read("vllm.v1.spec_decode.metadata.SpecDecodeMetadata.cu_num_sampled_tokens", "verify-logprob-token-ids",
         "where each request's rows end in the verify step's logits", "field", needs=("verify-logprob-token-ids",)),
    # four attributes, one fix: turning any off turns off all four
    Declared("verify-logit-bias-min-p", "vllm.sampling_params.SamplingParams._validate_spec_decode", "fix", "any",
             _WHY_BIAS, _patch_verify_logit_bias_min_p, needs=_BIAS_PARTS),
    Declared("verify-logits-processors", "vllm.v1.worker.gpu_model_runner.build_logitsprocs", "fix", "any",
             "vLLM's builtin logits processors (logit_bias, min_p, min_tokens) built for the sparrow method, as "
             "without speculation (with verify-logit-bias-min-p)", _patch_verify_logit_bias_min_p, needs=_BIAS_PARTS),
    Declared("verify-logit-bias-rows", f"{_RS}.RejectionSampler.apply_logits_processors", "fix", "any",
             "the request's logit_bias added to its drafted positions' rows (with verify-logit-bias-min-p)",
             _patch_verify_logit_bias_min_p, needs=_BIAS_PARTS),
    Declared("verify-min-p-rows", f"{_RS}.apply_sampling_constraints", "fix", "any",
             "the request's min_p cut on its drafted positions' rows (with verify-logit-bias-min-p)",
             _patch_verify_logit_bias_min_p, needs=_BIAS_PARTS),
    Read("vllm.v1.sample.logits_processor.BUILTIN_LOGITS_PROCESSORS", "verify-logit-bias-min-p",
         "the processors vLLM builds without speculation", "class", needs=("verify-logit-bias-min-p",)),
    Read(f"{_RS}.expand_batch_to_tokens", "verify-logit-bias-min-p", "a per-request value per drafted row", "class",
         needs=("verify-logit-bias-min-p",)),
    Read(f"{_RS}.apply_top_k_top_p", "verify-logit-bias-min-p", "top-k / top-p on the drafted rows", "class",
         needs=("verify-logit-bias-min-p",)),
    Read("vllm.v1.spec_decode.metadata.SpecDecodeMetadata.num_draft_tokens", "verify-logit-bias-min-p",
         "each request's drafted rows", "field", needs=("verify-logit-bias-min-p",)),
    Read("vllm.v1.sample.metadata.SamplingMetadata.logitsprocs", "verify-logit-bias-min-p",
         "the engine's builtin logits processors", "field", needs=("verify-logit-bias-min-p",)),
    Read("vllm.v1.sample.logits_processor.builtin.LogitBiasLogitsProcessor.biases", "verify-logit-bias-min-p",
         "each request's bias, by its index in the batch", "instance", needs=("verify-logit-bias-min-p",)),
    Read("vllm.v1.sample.logits_processor.builtin.MinPLogitsProcessor.min_p", "verify-logit-bias-min-p",
         "each request's min_p, by its index in the batch ([batch, 1])", "instance",
         needs=("verify-logit-bias-min-p",)),
    Read("vllm.v1.sample.logits_processor.builtin.MinPLogitsProcessor.min_p_count", "verify-logit-bias-min-p",
         "how many requests of the batch set min_p", "instance", needs=("verify-logit-bias-min-p",)),
)
