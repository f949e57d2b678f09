"""vLLM's rejection sampler expands per-request temperature/top-k/top-p to per-token values;
on the CPU build that must write real values, in the tensor's own dtype (patch
cpu-expand-kernel-dtype)."""

import pytest
import torch


@pytest.fixture(scope="module")
def expand():
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the C++ stand-in only replaces the Triton kernel on CPU")
    from vllm_sparrow.plugin import register

    register()
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    return expand_batch_to_tokens


def test_float_temperatures_are_expanded_per_token(expand):
    temperature = torch.tensor([0.3, 0.0, 0.7])  # greedy (0) reads as 1 for the division
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    out = expand(temperature, cu, 6, replace_from=0, replace_to=1)
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.tensor([0.3, 0.3, 1.0, 1.0, 1.0, 0.7]))


def test_int_top_k_is_expanded_per_token(expand):
    top_k = torch.tensor([5, 50], dtype=torch.int32)
    out = expand(top_k, torch.tensor([1, 4], dtype=torch.int32), 4)
    assert out.dtype == torch.int32
    assert out.tolist() == [5, 50, 50, 50]
