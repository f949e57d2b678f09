"""What the drafter and the proposer keep per request is bounded by the live requests (and, for
the recent requests' statistics, by RECENT_RELEASED), however many requests have been finished,
aborted or preempted: a server's memory after warm-up must not depend on how many it has served.

Checked on the drafter alone over thousands of requests (its structures' sizes, and the Python
memory it holds after a warm-up: constant), and through a real engine where requests finish, are
aborted and are preempted (every structure the proposer reports holds only live requests)."""

import random
import tracemalloc

import torch
from conftest import TRAINED_TEXTS, close_llm, make_llm
from vllm import SamplingParams

from support.engine_probe import drafter_stats
from sparrow_world.tiny_targets import make_prompt
from vllm_sparrow.attention import TorchWindowAttention
from vllm_sparrow.drafter import RECENT_RELEASED, SparrowDrafter, StepBatch
from vllm_sparrow.drafting.chain import CHAIN
from support.tiny_drafts import H, V, IO, tiny_draft

VIS, K, SLOTS = 7, 3, 16  # visual placeholder id, draft depth, draft cache slots
RECENT = 64  # the drafter's recent-requests ring in these tests (the served one: RECENT_RELEASED)


def _drafter() -> SparrowDrafter:
    return SparrowDrafter(tiny_draft(), IO(), (VIS,), TorchWindowAttention(), torch.device("cpu"), torch.float32,
                          max_requests=SLOTS, max_draft_tokens=K, max_text_tokens=256, recent_released=RECENT)


def _prefill(drafter, rids: list[str], rnd: random.Random, mid: bool = False) -> list[int]:
    """One packed step prefilling each request's prompt (text and visual rows); returns the
    prompt lengths. mid: the prompts continue in a later chunk (an abort can come then)."""
    prompts = [[1, 2] + [VIS] * rnd.randrange(0, 6) + [rnd.randrange(10, V) for _ in range(rnd.randrange(1, 5))]
               for _ in rids]
    starts = [sum(len(p) for p in prompts[:i]) for i in range(len(prompts))]
    tokens = torch.tensor([t for p in prompts for t in p])
    lens = [len(p) + (5 if mid else 0) for p in prompts]  # mid: the prompt is longer than this chunk
    batch = StepBatch.from_lists(rids, tokens, torch.randn(len(tokens), H), starts, [len(p) for p in prompts],
                                 [0] * len(rids), lens, torch.randint(10, V, (len(rids),)), [mid] * len(rids),
                                 visual_token_ids=(VIS,))
    CHAIN.step(drafter, batch, K)
    return [len(p) for p in prompts]


def _decode(drafter, rids: list[str], seen: list[int], rnd: random.Random) -> None:
    """One decode step of [last token, K drafts] per request, a random number accepted."""
    L = K + 1
    nv = [rnd.randrange(1, L + 1) for _ in rids]
    batch = StepBatch.from_lists(rids, torch.randint(10, V, (L * len(rids),)), torch.randn(L * len(rids), H),
                                 [L * i for i in range(len(rids))], nv, seen, seen,
                                 torch.randint(10, V, (len(rids),)), [False] * len(rids))
    CHAIN.step(drafter, batch, K)
    for i, n in enumerate(nv):
        seen[i] += n


def _serve_wave(drafter, wave: int, rnd: random.Random) -> dict[str, int]:
    """SLOTS requests join; a few are aborted mid-prefill, the rest decode two steps, one is
    preempted (released, then prefilled again from scratch) and all finish. Returns the text
    entries each finished request committed."""
    rids = [f"w{wave}-{i}" for i in range(SLOTS)]
    aborted = rids[:3]
    _prefill(drafter, aborted, rnd, mid=True)
    drafter.release(aborted)
    live = rids[3:]
    seen = _prefill(drafter, live, rnd)
    _decode(drafter, live, seen, rnd)
    drafter.release(live[:1])  # preempted: its slot goes back, the request comes back fresh
    seen[:1] = _prefill(drafter, live[:1], rnd)
    _decode(drafter, live, seen, rnd)
    expected = {r: int(drafter.state[drafter.slot_of[r], 0]) for r in live}
    drafter.release(live)
    return expected


def test_drafter_holds_live_requests_and_a_fixed_number_of_recent_ones():
    rnd, drafter = random.Random(3), _drafter()
    waves = 2 * RECENT // SLOTS + 4  # more requests than the recent ring holds, twice over
    expected = {}
    for w in range(waves):
        expected.update(_serve_wave(drafter, w, rnd))
        assert drafter.held()["slots"] == 0
        assert drafter.held()["recent"] <= RECENT
    stats = drafter.stats()
    # Each wave releases 17 times (3 aborted, 1 preempted and finished, 12 finished): 16 requests.
    assert stats["held"]["slots"] == 0 and RECENT - RECENT // 17 - 1 <= stats["held"]["recent"] <= RECENT
    assert len(stats["text_entries"]) == stats["held"]["recent"]
    newest = [r for r in expected if r.startswith(f"w{waves - 1}-") or r.startswith(f"w{waves - 2}-")]
    for r in newest:  # the latest requests' counts are exact, the preempted one's from its second run
        assert stats["text_entries"][r] == expected[r], r
    assert "w0-5" not in stats["text_entries"]  # the oldest are forgotten
    assert RECENT_RELEASED == 1024  # what a served drafter keeps: 8 KiB on the device, 1,024 ids on the host


def test_drafter_memory_does_not_grow_with_requests_served():
    """After a warm-up, serving 640 more requests leaves the drafter's Python-side memory where it
    was: the device ring and the slot map are allocated once, and request ids are the only strings
    held, a fixed number of them. (The warm-up is long because numpy's and torch's own caches fill
    over the first ~1,500 steps, then stay; holding a tensor per released request, as the drafter
    once did up to 4,096 of them, held 156 KB more here; the drafter now holds ~30 KB more, numpy's
    and torch's caches still filling.)"""
    rnd, drafter = random.Random(5), _drafter()
    for w in range(300):  # warm-up: 1,500 steps
        _serve_wave(drafter, w, rnd)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for w in range(1000, 1040):
            _serve_wave(drafter, w, rnd)
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes held after 40 more waves of {SLOTS} requests"


def test_engine_proposer_holds_only_live_requests_after_finishes_aborts_and_preemptions(target_dirs, trained_drafts,
                                                                                          clips):
    kind = "qwen2_5_vl"
    target, draft = target_dirs(kind), trained_drafts(kind)
    llm = make_llm(target, max_model_len=256, num_gpu_blocks_override=12, block_size=32, max_num_batched_tokens=256,
                   disable_log_stats=False,
                   speculative_config={"method": "sparrow", "model": str(draft), "num_speculative_tokens": 3})
    engine, greedy = llm.llm_engine, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    texts = TRAINED_TEXTS + [f"a shape number {i} moves" for i in range(8)]
    n = 0
    for wave in range(6):  # 6 waves of 12: text and video requests, 3 of each wave aborted
        ids = []
        for i in range(12):
            video = i % 4 == 0
            prompt = make_prompt(kind, target, texts[(wave + i) % len(texts)], "video" if video else None)
            engine.add_request(str(n), {"prompt": prompt, "multi_modal_data": {"video": clips(4)}} if video else prompt,
                               greedy)
            ids.append(str(n))
            n += 1
        steps = 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
            if steps == 3:
                engine.abort_request(ids[:3])
    preempted = int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"))
    llm.generate([texts[0]], SamplingParams(max_tokens=1))  # the worker learns of the last finishes
    held = drafter_stats(llm)["held"]
    close_llm(llm)
    assert preempted > 0, "the KV budget must force preemptions"
    assert held["slots"] <= 1 and held["prompt_layouts"] <= 1, held  # at most the follow-up request
    assert held["recent"] <= min(n + 1, RECENT_RELEASED), held
