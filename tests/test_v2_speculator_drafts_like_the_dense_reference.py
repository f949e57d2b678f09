"""Under vLLM 0.34's own Python (`make test-v2-runner`), the V2 runner's speculator
(vllm_sparrow/v2_runner/speculator.py) built from real 0.34 config objects and driven through
propose() with 0.34's own InputBatch and RequestState on CPU tensors (its Triton bookkeeping
kernels run under Triton's interpreter, as make test-v2-runner sets up; its pinned-memory buffers
are the CPU worker's own stand-ins, vllm.v1.worker.cpu.shm) drafts what the dense reference
drafts (tests/support/dense_reference.py), at every step, for: video requests decoding with random
acceptance, a 3,000-token text prompt arriving in chunks beside 16 of them, requests finished and
new ones taking their slots, a step with num_speculative_tokens 0 (nothing drafted, its states
still committed: the next step's drafts need them), a request preempted (0.34 tells the speculator nothing) and
resumed with its outputs folded into its prefill (the drafter's restart path), and one preempted
for good, whose slot goes back when the next request arrives. With probabilistic verification a
sampled request leaves in vLLM's draft-logits cache the distribution its drafts were drawn from. No propose() reads the device from the host.

The steps are made here the way 0.34's runner makes them (a stand-in for its bookkeeping, written
from its interface: rows per request, num_sampled / num_rejected, last_sampled and
next_prefill_tokens by request-state slot); the dense reference sees only what the target
computed, never the glue's StepBatch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.dense_reference import StreamReplay, check_engine_drafts
from support.engine_probe import _RecordingIO
from safetensors.torch import load_file

from sparrow_world.bench.op_count import OpCounter

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFT = ROOT / "models/world-hard/target", ROOT / "models/world-hard/sparrow"
K, MAX_REQS, MAX_LEN, BUDGET = 4, 24, 8192, 4096


class TargetHeads(torch.nn.Module):
    """The hard target's embedding and LM head from its checkpoint: all the draft shares of it."""

    def __init__(self) -> None:
        super().__init__()
        w = load_file(TARGET / "model.safetensors")
        self.embed = torch.nn.Embedding.from_pretrained(w["model.embed_tokens.weight"].float())
        self.head = w["lm_head.weight"].float()  # [vocab, H]

    def get_language_model(self):
        return self

    def embed_input_ids(self, ids):
        return self.embed(ids)

    def compute_logits(self, hidden):
        return hidden.float() @ self.head.T


@pytest.fixture(scope="module")
def built():
    return _build("greedy")


@pytest.fixture(scope="module")
def built_sampled():
    return _build("probabilistic")


@pytest.fixture(scope="module")
def built_adaptive():
    return _build("probabilistic", adaptive_verification=True)


def _build(draft_sample_method: str, adaptive_verification: bool = False) -> "Runner":
    import vllm.v1.worker.cpu.shm  # noqa: F401 - the CPU worker's stand-ins for pinned memory and streams
    from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
    from vllm.v1.worker.gpu.states import RequestState

    from vllm_sparrow.v2_runner.method import register
    from vllm_sparrow.v2_runner.speculator import SparrowSpeculator

    register()
    model = ModelConfig(model=str(TARGET), dtype="float32", max_model_len=MAX_LEN)
    spec = SpeculativeConfig(method="sparrow", model=str(DRAFT), num_speculative_tokens=K,
                             draft_sample_method=draft_sample_method,
                             target_model_config=model, target_parallel_config=ParallelConfig())
    config = VllmConfig(model_config=model, speculative_config=spec, device_config=DeviceConfig(device="cpu"),
                        scheduler_config=SchedulerConfig(max_num_seqs=MAX_REQS, max_num_batched_tokens=BUDGET,
                                                         max_model_len=MAX_LEN, is_encoder_decoder=False))
    # Set after the VllmConfig checks it: on a CPU the engine refuses adaptive verification (it needs full
    # CUDA graphs); below the runner the speculator takes it as on a GPU.
    spec.enable_adaptive_verification = adaptive_verification
    states = RequestState(MAX_REQS, MAX_LEN, BUDGET, K, model.get_vocab_size(), torch.device("cpu"))
    speculator = SparrowSpeculator(config, torch.device("cpu"), req_states=states)
    target = TargetHeads()  # the drafter holds it weakly, as it does vLLM's target
    speculator.load_model(target)
    drafter = speculator.served.drafter
    drafter.io = _RecordingIO(drafter.io, logits := [])
    from vllm_sparrow.targets import target_spec

    visual = set(target_spec(model.hf_config).visual_token_ids)
    run = Runner(speculator, states, logits, visual, model.get_vocab_size())
    run.target = target
    return run


class Runner:
    """0.34's runner bookkeeping for the test's requests: which rows each step runs, what the target
    computed (a state per position, seeded by request and position), what was accepted."""

    def __init__(self, speculator, states, logits, visual: set[int], vocab: int) -> None:
        self.spec, self.states, self.logits, self.visual = speculator, states, logits, visual
        self.text_ids = np.array([t for t in range(vocab) if t not in visual])
        self.rng = np.random.default_rng(0)
        self.reqs: dict[str, dict] = {}  # id -> tokens (prompt + outputs), prompt, computed, drafts
        self.prompt_len: dict[str, int] = {}  # the replay's key (id before "-") -> prompt length
        self.records: list[dict] = []
        self.host_reads: list[str] = []
        self.temperature = torch.zeros(MAX_REQS)  # [max_num_reqs] by request-state slot, as vLLM's
        self.confidences = speculator.acceptance_estimator  # adaptive verification: the runner reads them

    def _text(self, n: int) -> list[int]:
        return [int(t) for t in self.rng.choice(self.text_ids, n)]

    def add(self, req_id: str, prompt: list[int], resumed: list[int] | None = None) -> None:
        tokens = prompt + (resumed or [])
        self.states.add_request(req_id, len(prompt), tokens, 0, 64)
        self.spec.add_request(self.states.req_id_to_index[req_id])
        self.states.apply_staged_writes()
        self.reqs[req_id] = {"tokens": tokens, "prompt": len(prompt), "prefill": len(tokens), "computed": 0,
                             "drafts": None}
        self.prompt_len[req_id.rsplit("-", 1)[0]] = len(prompt)

    def video_prompt(self, visual: int) -> list[int]:
        vid = sorted(self.visual)[-1]
        return self._text(12) + [vid] * visual + self._text(9)

    def remove(self, req_id: str, finished: bool) -> None:
        """finished: vLLM tells the speculator; else preempted (0.34 does not)."""
        if finished:
            self.spec.on_requests_finished({req_id})
        self.states.remove_request(req_id)
        self.reqs.pop(req_id)

    def step(self, chunk: dict[str, int], k: int = K) -> None:
        """One engine step: every live request runs, decoding with its drafts or through `chunk[id]`
        tokens of its prefill (the rest of it when not given); k: the step's
        num_speculative_tokens (0: vLLM schedules no drafts, the next step verifies none)."""
        from vllm.v1.worker.gpu.input_batch import InputBatch

        order = sorted(self.reqs, key=lambda r: self.reqs[r]["computed"] < self.reqs[r]["prefill"])  # decodes first
        rows, hidden, qlen, computed, n_sampled, n_rejected, plan = [], [], [], [], [], [], []
        for r in order:
            q = self.reqs[r]
            c = q["computed"]
            if c < q["prefill"]:  # a prefill chunk: never ends one token short (vLLM's lookahead of 1)
                left = q["prefill"] - c
                size = min(chunk.get(r, left), left)
                size = left if left - size == 1 else size
                toks, sampled, rejected = q["tokens"][c : c + size], int(size == left), 0
            else:  # decode: the last sampled token and the drafts of the previous step
                drafts = q["drafts"] if q["drafts"] is not None else []
                toks = [q["tokens"][-1]] + drafts
                accepted = int(self.rng.integers(0, len(drafts) + 1))
                sampled, rejected = accepted + 1, len(drafts) - accepted
            rows += toks
            hidden.append(self._states(r, c, len(toks)))
            qlen.append(len(toks)), computed.append(c), n_sampled.append(sampled), n_rejected.append(rejected)
            plan.append((r, toks))
        n, T = len(order), len(rows)
        slots = np.array([self.states.req_id_to_index[r] for r in order], dtype=np.intp)
        qs = np.concatenate([[0], np.cumsum(qlen)]).astype(np.int32)
        comp = np.array(computed, dtype=np.int32)
        prefill = self.states.prefill_len.np[slots]
        prefilling = comp < prefill
        nxt, last = self.states.next_prefill_tokens, self.states.last_sampled_tokens
        for i, (r, toks) in enumerate(plan):  # what the target's sampler leaves before propose()
            q, c = self.reqs[r], computed[i]
            if not n_sampled[i]:  # a prefill chunk that is not its last: the token after it
                nxt[0, slots[i]] = q["tokens"][c + len(toks)]
                continue
            accepted = toks[1 : n_sampled[i]] if not prefilling[i] else []  # drafts the target kept
            new = self._text(1)[0]  # the token it sampled after them
            q["tokens"] = q["tokens"] + accepted + [new]
            last[slots[i], 0] = new
        batch = InputBatch(
            req_ids=list(order), num_reqs=n, num_reqs_after_padding=n,
            idx_mapping=torch.from_numpy(slots.astype(np.int64)), idx_mapping_np=slots,
            expanded_idx_mapping=torch.from_numpy(np.repeat(slots, 1).astype(np.int64)),
            expanded_local_pos=torch.zeros(n, dtype=torch.int32),
            num_scheduled_tokens=np.array(qlen, dtype=np.int32), num_tokens=T, num_tokens_after_padding=T + 3,
            num_draft_tokens=int(sum(max(0, l - 1) for l, p in zip(qlen, prefilling) if not p)),
            num_draft_tokens_per_req=None, query_start_loc=torch.from_numpy(qs), query_start_loc_np=qs,
            seq_lens=torch.from_numpy(comp + np.array(qlen, dtype=np.int32)),
            seq_lens_cpu_upper_bound=torch.from_numpy(comp + np.array(qlen, dtype=np.int32)),
            dcp_local_seq_lens=None, num_computed_tokens_np=comp, prefill_len_np=prefill,
            num_computed_prefill_tokens_np=np.minimum(comp, prefill), is_prefilling_np=prefilling,
            has_prefill=bool(prefilling.any()), decode_graph_eligible=not prefilling.any(),
            input_ids=torch.tensor(rows + [0, 0, 0], dtype=torch.int32),
            positions=torch.from_numpy(np.concatenate([c + np.arange(l) for c, l in zip(comp, qlen)])),
            is_padding=torch.zeros(T + 3, dtype=torch.bool), logits_indices=torch.zeros(n, dtype=torch.int64),
            cu_num_logits=torch.arange(n + 1, dtype=torch.int32), cu_num_logits_np=np.arange(n + 1, dtype=np.int32),
            has_structured_output_reqs=False, prompt_lens=None)
        states = torch.cat(hidden + [torch.full((3, hidden[0].shape[1]), 7.0)])  # padding rows past T
        self.logits.clear()
        if self.confidences is not None:  # the runner grades the last drafts before each propose
            self.spec.observe_verification(batch.idx_mapping, torch.tensor(n_sampled, dtype=torch.int32),
                                           torch.tensor(n_rejected, dtype=torch.int32))
            self.spec.draft_token_confidence_probs.fill_(float("nan"))
        with OpCounter() as counter, torch.inference_mode():
            out = self.spec.propose(batch, None, None, states, None,
                                    torch.tensor(n_sampled, dtype=torch.int32), torch.tensor(n_rejected, dtype=torch.int32),
                                    last, nxt, self.temperature, torch.zeros(MAX_REQS, dtype=torch.int64),
                                    num_speculative_tokens=k)
        self.host_reads += counter.host_reads
        if k == 0:
            assert not any(any(d) for d in out.tolist()) and self.logits == [], "K = 0: nothing drafted"
        drafts = [row[:k] for row in out.tolist()]  # the runner masks the columns past the step's depth
        for i, (r, toks) in enumerate(plan):
            q = self.reqs[r]
            q["computed"] += len(toks) - n_rejected[i]
            q["drafts"] = (drafts[i] if k else []) if n_sampled[i] else None
        valid = [l - j for l, j in zip(qlen, n_rejected)]
        self.records.append({
            "req_ids": list(order), "token_ids": torch.tensor(rows), "hidden": states[:T].clone(),
            "row_start": qs[:-1].tolist(), "num_valid": valid, "seq_start": computed,
            "next_token": [int(last[s, 0]) if ns else int(nxt[0, s]) for s, ns in zip(slots, n_sampled)],
            "mid_prefill": [not ns for ns in n_sampled], "drafts": drafts, "slots": slots.tolist(),
            "logits": [x for x in self.logits if x.shape[0] == n], "k": k,
            "confidences": None if self.confidences is None else self.spec.draft_token_confidence_probs[:n].clone()})

    def _states(self, req_id: str, start: int, n: int) -> torch.Tensor:
        """[n, H] what the target computed at positions start.. of the request (fixed per position)."""
        key = hash(req_id.rsplit("-", 1)[0]) % 2**31
        H = self.spec.served.model.cfg.hidden_size
        return torch.stack([torch.randn(H, generator=torch.Generator().manual_seed(key * 9973 + p))
                            for p in range(start, start + n)])


def test_the_v2_speculator_drafts_what_the_dense_reference_drafts(built):
    run = built
    for v in range(16):  # video requests, prefilled then decoding
        run.add(f"v{v}-a", run.video_prompt(visual=40 + 8 * v))
    run.step({})
    for _ in range(3):
        run.step({})
    long_text = run._text(3000)
    run.add("long-a", long_text)
    for _ in range(4):  # its prompt arrives in chunks beside 16 video decodes
        run.step({"long-a": 900})
    run.remove("v3-a", finished=True)
    run.remove("v4-a", finished=True)
    run.add("late-a", run.video_prompt(visual=30))  # takes a freed slot
    run.step({})
    undrafted = len(run.records)
    run.step({}, k=0)  # no drafts this step: its states are still committed (the next drafts need them)
    outputs = run.reqs["v5-a"]["tokens"][run.reqs["v5-a"]["prompt"]:]
    prompt = run.reqs["v5-a"]["tokens"][: run.reqs["v5-a"]["prompt"]]
    run.remove("v5-a", finished=False)  # preempted: the speculator is not told
    run.step({})
    run.add("v5-a", prompt, resumed=outputs)  # recomputed from scratch, outputs folded into the prefill
    run.step({})  # v5 kept its draft slot: the drafter's restart path takes it
    run.remove("v6-a", finished=False)  # preempted, and not back before a newcomer arrives
    run.add("late2-a", run.video_prompt(visual=20))
    assert "v6-a" not in run.spec.served.drafter.tracked()  # its slot went back for the newcomer
    for _ in range(2):
        run.step({})
    run.spec.on_requests_finished({"v6-a"})  # aborted while preempted: told, though no longer in the runner
    replay = StreamReplay(run.visual, run.prompt_len)
    model, io = run.spec.served.model, run.spec.served.drafter.io.inner
    checked = set(range(len(run.records))) - {undrafted}
    counts = check_engine_drafts(run.records, replay, model, io, atol=2e-3, only=checked)
    assert counts["drafting"] > 150 and counts["restarts"] >= 1 and counts["prefill_rows"] >= 3, counts
    assert run.host_reads == []
    held = run.spec.served.drafter.held()
    assert held["slots"] == len(run.reqs)  # v3, v4 released when finished, v6 when a newcomer came
    assert set(run.spec.served.layouts.by_request) == set(run.reqs)  # prompt layouts of live requests only


def test_sampled_drafts_leave_the_distribution_they_were_drawn_from_for_vllms_rejection_sampler(built_sampled):
    """With probabilistic verification (draft_sample_method "probabilistic"), a request at T > 0
    drafts from q = softmax(draft logits / T) and leaves softmax(values / T) = q in vLLM's draft-
    logits cache, at its request-state slot and each draft position (what 0.34's rejection sampler
    reads as the draft distribution); a greedy request beside it drafts the argmax."""
    run = built_sampled
    cache = run.spec.draft_logits
    assert cache is not None and tuple(cache.values.shape[:2]) == (MAX_REQS, K)
    for v in range(6):
        run.add(f"s{v}-a", run.video_prompt(visual=24 + 8 * v))
        run.temperature[run.states.req_id_to_index[f"s{v}-a"]] = 0.7 if v % 2 else 0.0
    compared = 0
    for _ in range(5):
        run.step({})
        rec = run.records[-1]
        for b, (slot, mid) in enumerate(zip(rec["slots"], rec["mid_prefill"])):
            if mid:
                continue
            t = float(run.temperature[slot])
            for k in range(K):
                logits = rec["logits"][k][b]
                draft = rec["drafts"][b][k]
                if t == 0.0:
                    assert draft == int(logits.argmax())
                    continue
                q = torch.softmax(logits / t, -1)
                stored = torch.softmax(cache.values[slot, k].float() / t, -1)
                assert torch.allclose(stored, q, atol=1e-5), (slot, k)
                assert q[draft] > 0
                compared += 1
    assert compared >= 3 * 4 * K  # three sampled requests, four decode steps


def test_each_step_drafts_the_depth_the_runner_schedules(built_adaptive):
    """0.34's runner passes each step's depth (num_speculative_tokens: its per-batch-size schedule)
    and masks the columns past it. The speculator drafts exactly that many tokens: one draft
    logits row per drafted position (a step drafting K for a scheduled k has K rows and fails the
    dense reference's comparison), the drafts equal to the dense reference's at every depth, also
    when the rows a step verifies come from a deeper step than the one it drafts."""
    run = built_adaptive
    for v in range(6):
        run.add(f"d{v}-a", run.video_prompt(visual=16 + 8 * v))
    start = len(run.records)
    for i, k in enumerate([K, 1, 1, 3, K, 2, 1, K, 1]):
        if i == 4:
            run.add("dlong-a", run._text(400))  # its chunks arrive beside decodes at a shallow depth
        run.step({"dlong-a": 150}, k=k)
        rec = run.records[-1]
        drafting = [b for b, mid in enumerate(rec["mid_prefill"]) if not mid]
        assert len(rec["logits"]) == (k if drafting else 0), f"step {i}: {len(rec['logits'])} positions for depth {k}"
    replay = StreamReplay(run.visual, run.prompt_len)
    model, io = run.spec.served.model, run.spec.served.drafter.io.inner
    counts = check_engine_drafts(run.records, replay, model, io, atol=2e-3, only=set(range(start, len(run.records))))
    assert counts["drafting"] >= 40, counts
    assert run.host_reads == []


def test_every_drafted_position_gets_the_confidence_adaptive_verification_reads(built_adaptive):
    """With enable_adaptive_verification, the runner budgets each request's verification from
    draft_token_confidence_probs [by batch row, position], read after every propose(). Filled with
    NaN before each step, every drafted position of every drafting row is written, by vLLM's own
    estimator on Sparrow's draft logits: before any refit, the draft distribution's own max
    probability (after the request's temperature), greedy and sampled requests alike, whatever the
    step's depth. Drafts stay the dense reference's (checked in the test above, on this engine)."""
    run = built_adaptive
    for v in range(4):
        run.add(f"c{v}-a", run.video_prompt(visual=20 + 8 * v))
        run.temperature[run.states.req_id_to_index[f"c{v}-a"]] = 0.7 if v % 2 else 0.0
    checked = 0
    for k in (K, 2, K, 1, 3):
        run.step({}, k=k)
        rec = run.records[-1]
        conf = rec["confidences"]  # [B, K]
        for b, (slot, mid) in enumerate(zip(rec["slots"], rec["mid_prefill"])):
            if mid:
                continue
            t = float(run.temperature[slot]) or 1.0
            for pos in range(k):
                expected = torch.softmax(rec["logits"][pos][b].float() / t, -1).max()
                assert torch.isfinite(conf[b, pos]), f"row {b} position {pos} left unwritten at depth {k}"
                assert abs(float(conf[b, pos]) - float(expected)) < 1e-4, (b, pos, float(conf[b, pos]), float(expected))
                checked += 1
    assert checked >= 4 * (K + 2 + K + 1 + 3) - 4 * K, checked  # every live request drafts after its prefill step
