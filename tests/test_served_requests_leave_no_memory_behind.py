"""What a serving engine holds does not grow with the requests it has served: an engine with
Sparrow, in this process (vLLM's engine core and worker too: VLLM_ENABLE_V1_MULTIPROCESSING=0),
serves waves of text and video requests that finish, are aborted mid-decode and are preempted (a
KV budget of a few blocks), and the bytes of every live tensor and every Python object the process
holds are counted after 100 and after 500 requests. Between the two, Sparrow's engine may grow by
no more than the same engine without speculation does under the same waves, plus a bar far below
what a leak of a few KiB a request adds over 400 requests.

Counted, not sampled: live tensors by their storage (each storage once, so views and shared
weights count once), Python objects by sys.getsizeof over everything the garbage collector tracks
and everything untracked they hold, after a collection. Neither needs the heap to settle, so no
long warm-up: what matters is that the 400 requests between the readings leave nothing behind,
whatever structure would hold it (the drafter, the glue, a module's global). Measured here: no
speculation's engine grows by about +570 KiB of Python objects (vLLM's own, about the same over
900 requests: it does not grow with them) and -1 KiB of tensors, Sparrow's by 8 to 59 KiB more
objects and -4 KiB of tensors. Over 900 requests a drafter keeping a copy of each released
request's ring grew +37 MiB of tensors and a 2 KiB array kept per released request +2.0 MiB of
objects; over these 400, the ring copy grows +16.5 MiB of tensors, and a 2 KiB tensor kept per
released request +947 KiB (and +370 KiB of objects, the tensors' own). 1,000 requests took twice the time and caught
nothing more. The soak over a real server (benchmarks/server_soak.py: RSS, whose phase-to-phase noise
without speculation is tens of MiB) stays a benchmark.
"""

import gc
import random
import sys

import pytest
import torch
from conftest import TRAINED_TEXTS, close_llm, make_llm
from vllm import SamplingParams

from sparrow_world.tiny_targets import make_prompt

KIND = "qwen2_5_vl"
WAVE = 16  # requests per wave, all in flight together
READINGS = (100, 500)  # requests served at each reading
TENSOR_BAR = 256 << 10  # bytes Sparrow's engine may grow by beyond no speculation's: < 0.7 KiB a request
OBJECT_BAR = 256 << 10  # the same for Python objects: < 0.7 KiB a request (4x Sparrow's largest extra seen)
ENGINE = dict(max_model_len=256, num_gpu_blocks_override=12, block_size=32, max_num_batched_tokens=256,
              max_num_seqs=WAVE)


def held_bytes() -> tuple[int, int]:
    """(bytes of live tensor storages, bytes of Python objects): every object the collector tracks
    (containers, instances) and every untracked one they hold, however deep (str, bytes, numbers,
    numpy arrays with their data, and containers the collector untracks because they hold only
    such objects: a dict of arrays), each once."""
    gc.collect()
    storages: dict[int, int] = {}  # storage address -> bytes
    seen: set[int] = set()
    objects = 0

    def count(obj) -> None:
        nonlocal objects
        if id(obj) in seen:
            return
        seen.add(id(obj))
        try:
            objects += sys.getsizeof(obj)
            if isinstance(obj, torch.Tensor) and not obj.is_meta:
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        except Exception:  # noqa: BLE001 - an object that cannot say its size (a lazy proxy) counts as nothing
            pass

    tracked = gc.get_objects()
    for obj in tracked:
        count(obj)
    untracked = [o for o in gc.get_referents(*tracked) if not gc.is_tracked(o)]
    del tracked
    while untracked:  # the objects only untracked containers reach, level by level
        fresh = [o for o in untracked if id(o) not in seen]
        for obj in fresh:
            count(obj)
        untracked = gc.get_referents(*fresh) if fresh else []
    return sum(storages.values()), objects


def _prompts(target, clips) -> list:
    texts = TRAINED_TEXTS + [f"{w} goes round and round" for w in
                             ("a green triangle", "the yellow dot", "one purple star", "two orange boxes")]
    videos = [{"prompt": make_prompt(KIND, target, f"describe video {n}", "video"),
               "multi_modal_data": {"video": clips(n)}} for n in (4, 8)]
    return [make_prompt(KIND, target, t, None) for t in texts] + videos


def _serve(engine, prompts: list, served: int, until: int, rnd: random.Random) -> int:
    """Waves of WAVE requests until `until` have been served: each request a random prompt, greedy
    or sampled, 8 to 24 tokens; two of each wave aborted at its third step."""
    while served < until:
        ids = [f"r{served + i}" for i in range(WAVE)]
        for rid in ids:
            params = SamplingParams(temperature=rnd.choice([0.0, 0.8]), max_tokens=rnd.randrange(8, 25),
                                    ignore_eos=True)
            engine.add_request(rid, rnd.choice(prompts), params)
        steps = 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
            if steps == 3:
                engine.abort_request(rnd.sample(ids, 2))
        served += WAVE
    return served


def _growth(llm, prompts) -> tuple[int, int, int]:
    """(tensor bytes, object bytes) grown between the readings, and the preemptions seen."""
    engine, rnd = llm.llm_engine, random.Random(0)
    served = _serve(engine, prompts, 0, READINGS[0], rnd)
    tensors0, objects0 = held_bytes()
    _serve(engine, prompts, served, READINGS[1], rnd)
    tensors1, objects1 = held_bytes()
    preempted = int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions"))
    return tensors1 - tensors0, objects1 - objects0, preempted


@pytest.fixture(scope="module")
def growth(target_dirs, trained_drafts, clips):
    target, draft = target_dirs(KIND), trained_drafts(KIND)
    prompts = _prompts(target, clips)
    out = {}
    for method, spec in (("none", None), ("sparrow", {"method": "sparrow", "model": str(draft),
                                                      "num_speculative_tokens": 3})):
        llm = make_llm(target, disable_log_stats=False, speculative_config=spec, **ENGINE)
        try:
            out[method] = _growth(llm, prompts)
        finally:
            close_llm(llm)
        gc.collect()
    print("grown between", READINGS, "requests (tensor bytes, object bytes, preemptions):", out)
    return out


def test_requests_were_preempted_as_well_as_finished_and_aborted(growth):
    assert growth["none"][2] > 0 and growth["sparrow"][2] > 0, growth


def test_sparrow_engine_holds_no_more_tensor_bytes_after_500_requests_than_after_100(growth):
    none, sparrow = growth["none"][0], growth["sparrow"][0]
    assert sparrow <= max(none, 0) + TENSOR_BAR, (
        f"live tensors grew {sparrow / 1024:+.1f} KiB over {READINGS[1] - READINGS[0]} requests with Sparrow, "
        f"{none / 1024:+.1f} KiB without")


def test_sparrow_engine_holds_no_more_python_objects_after_500_requests_than_after_100(growth):
    none, sparrow = growth["none"][1], growth["sparrow"][1]
    assert sparrow <= max(none, 0) + OBJECT_BAR, (
        f"Python objects grew {sparrow / 1024:+.1f} KiB over {READINGS[1] - READINGS[0]} requests with Sparrow, "
        f"{none / 1024:+.1f} KiB without")
