"""The Triton kernel of request-keyed draft noise (kernels/request_noise.py, the CUDA path) gives
its torch reference's noise (kernels/request_noise_ref.py, the CPU path): the same hash bits in
uint32 arithmetic, so the same Exp(1) values up to the last bit of log, at shapes that end
mid-block, rows over several reference chunks and keys of every sign. Run under Triton's
interpreter (TRITON_INTERPRET=1) in a child process, as the window-attention kernel's test."""

import os
import subprocess
import sys

import pytest
import torch

CHILD = os.environ.get("SPARROW_TRITON_CHILD") == "1"
child_only = pytest.mark.skipif(not CHILD, reason="runs inside test_kernel_under_the_interpreter")

from vllm_sparrow_kernels.request_noise_ref import ROWS_PER_CHUNK, exponential_noise_ref, row_keys

if CHILD:
    from vllm_sparrow_kernels.request_noise import exponential_noise


@pytest.mark.skipif(CHILD, reason="the parent of the interpreter run")
def test_kernel_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "SPARROW_TRITON_CHILD": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "2 passed" in run.stdout, run.stdout[-2000:]  # both kernel tests ran


@child_only
@pytest.mark.parametrize("rows, vocab", [(3, 1000), (ROWS_PER_CHUNK + 5, 2500)])
def test_the_kernels_noise_is_the_references(rows, vocab):
    g = torch.Generator().manual_seed(rows)
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=g)
    positions = torch.randint(0, 40_000, (rows,), generator=g)
    keys = row_keys(seeds, positions)  # [rows] int32, negative ones included
    assert (keys < 0).any() and (keys > 0).any()
    ref = exponential_noise_ref(keys, torch.empty(rows, vocab))
    got = exponential_noise(keys, torch.empty(rows, vocab), block=512)  # the last block ends mid-way
    assert torch.allclose(got, ref, rtol=1e-6, atol=0), (got - ref).abs().max()
