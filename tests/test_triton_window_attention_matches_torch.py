"""The Triton kernels (cache write, text-anchored window attention) equal their torch reference
under the Triton interpreter, over randomised mixed batches: ragged runs, windows larger and
smaller than the run, anchors overlapping the window, runs crossing page boundaries, requests
with no text rows, GQA ratios 1/2/4/7, head dims 32/64, fp32 and fp16 (the interpreter computes
bf16 wrongly, so bf16 is left to GPU runs)."""

import os
import subprocess
import sys

import pytest
import torch

# TRITON_INTERPRET must hold before triton decorates the kernels, and must not leak into the
# vLLM engines of other test modules: the kernel tests run in a child pytest process.
CHILD = os.environ.get("SPARROW_TRITON_CHILD") == "1"
child_only = pytest.mark.skipif(not CHILD, reason="runs inside test_kernels_under_the_interpreter")

if CHILD:
    from vllm_sparrow_kernels.window_attention import window_attention, write_kv
    from vllm_sparrow_kernels.window_attention_ref import window_attention_ref, write_kv_ref

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


@pytest.mark.skipif(CHILD, reason="the parent of the interpreter run")
def test_kernels_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "SPARROW_TRITON_CHILD": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    import re

    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed and int(passed.group(1)) >= 10, run.stdout[-2000:]  # every kernel test ran


def _batch(seed, kv_heads, group, d, dtype, bs=4):
    """Random requests with random text lengths; the new rows of each are its last `run` indices."""
    g = torch.Generator().manual_seed(seed)
    lengths = [int(x) for x in torch.randint(0, 23, (4,), generator=g)]  # 0: a request with no text
    runs = [min(n, int(torch.randint(1, 6, (1,), generator=g))) if n else 0 for n in lengths]
    max_blocks = max(1, (max(lengths) + bs - 1) // bs)
    num_blocks = 4 * max_blocks + 3
    perm = torch.randperm(num_blocks, generator=g)  # pages scattered over the pool
    tables = perm[: 4 * max_blocks].view(4, max_blocks).int()
    shape = (num_blocks, bs, kv_heads, d)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    row_req = torch.cat([torch.full((r,), i) for i, r in enumerate(runs)]).int()
    row_pos = torch.cat([torch.arange(n - r, n) for n, r in zip(lengths, runs)]).int()
    q = torch.randn(len(row_req), kv_heads * group, d, generator=g).to(dtype)
    k_new = torch.randn(len(row_req), kv_heads, d, generator=g).to(dtype)
    v_new = torch.randn(len(row_req), kv_heads, d, generator=g).to(dtype)
    slots = (tables[row_req.long(), row_pos.long() // bs].long() * bs + row_pos.long() % bs)
    return q, k_new, v_new, k_cache, v_cache, tables, row_req, row_pos, slots


F32, F16 = torch.float32, torch.float16
# (GQA group, dtype, anchors A, window W (0 = all), head dim): W below, within and above the run
# lengths, anchors inside and beyond the window, every GQA ratio, both head dims.
CASES = [(1, F32, 0, 0, 32), (2, F16, 2, 3, 64), (4, F32, 4, 6, 32), (7, F16, 3, 100, 32),
         (2, F32, 6, 2, 32), (1, F16, 4, 6, 64), (4, F16, 0, 0, 32), (7, F32, 2, 3, 32)]


@child_only
@pytest.mark.parametrize("group,dtype,anchors,window,d", CASES)
def test_write_then_attend_equals_the_reference(group, dtype, anchors, window, d):
    for seed in range(2):
        q, k_new, v_new, kc, vc, tables, row_req, row_pos, slots = _batch(seed, 2 if group < 7 else 1, group, d, dtype)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        write_kv(kc, vc, slots, k_new, v_new)
        write_kv_ref(kc_ref, vc_ref, slots, k_new, v_new)
        assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
        scale = d ** -0.5
        out = window_attention(q, kc, vc, tables, row_req, row_pos, anchors, window, scale, block_n=4)
        ref = window_attention_ref(q, kc_ref, vc_ref, tables, row_req, row_pos, anchors, window, scale)
        torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=TOL[dtype])


@child_only
def test_empty_batch_is_a_no_op():
    kc = torch.zeros(2, 4, 1, 32)
    out = window_attention(torch.zeros(0, 1, 32), kc, kc, torch.zeros(1, 1, dtype=torch.int32),
                           torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 2, 4, 1.0)
    assert out.shape == (0, 1, 32)


@child_only
def test_drafter_on_the_triton_backend_drafts_like_the_torch_backend():
    """The serving drafter, prefill then three verify steps, through both backends."""
    from vllm_sparrow.attention import TorchWindowAttention, TritonWindowAttention
    from vllm_sparrow.config import SparrowConfig
    from vllm_sparrow.drafter import SparrowDrafter, StepBatch
    from vllm_sparrow.model import SparrowDraftModel

    cfg = SparrowConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=40, anchor_tokens=2, window_tokens=5, cache_block_size=4)
    torch.manual_seed(0)
    model = SparrowDraftModel(cfg).eval()
    table = torch.randn(40, 64)

    class IO:
        def embed(self, ids):
            return table[ids]

        def logits(self, h):
            return h @ table.T

    g = torch.Generator().manual_seed(1)
    tokens, hidden = torch.randint(0, 40, (30,), generator=g), torch.randn(30, 64, generator=g)
    seen = {}
    for backend in (TorchWindowAttention(), TritonWindowAttention()):
        drafter = SparrowDrafter(model, IO(), (), backend, torch.device("cpu"), torch.float32)
        logits = []

        def sample(lg, rows):
            logits.append(lg.clone())
            return lg.argmax(-1), None

        lo, c = 0, 9
        for step in range(4):
            batch = StepBatch(["a"], tokens[lo:c], hidden[lo:c], [0], [c - lo], [lo], [9], tokens[c:c + 1], [False])
            drafter.step(batch, 3, sample)
            lo, c = c, c + 1 + step  # accept `step` drafts each time
        seen[backend.name] = torch.cat(logits)
    torch.testing.assert_close(seen["triton"], seen["torch"], atol=1e-4, rtol=1e-4)


@child_only
def test_backend_choice_follows_the_device_and_the_environment(monkeypatch):
    from vllm_sparrow.attention import select_backend

    monkeypatch.delenv("SPARROW_ATTENTION_BACKEND", raising=False)
    assert select_backend(torch.device("cpu")).name == "torch"
    monkeypatch.setenv("SPARROW_ATTENTION_BACKEND", "triton")
    assert select_backend(torch.device("cpu")).name == "triton"  # TRITON_INTERPRET=1 here
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        select_backend(torch.device("cpu"))
    monkeypatch.setenv("SPARROW_ATTENTION_BACKEND", "flash")
    with pytest.raises(ValueError, match="use 'torch' or 'triton'"):
        select_backend(torch.device("cpu"))
