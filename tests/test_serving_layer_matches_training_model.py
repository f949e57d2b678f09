"""The fused serving layer (merged QKV and gate/up, one input norm, RoPE table) computes what the
training model computes, in float32, to rounding."""

import pytest
import torch

from vllm_sparrow.config import SparrowConfig
from vllm_sparrow.model import SparrowDraftModel
from vllm_sparrow.serving_layer import SparrowServingLayer
from vllm_sparrow.window import WindowSpec


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (4, 4, 32), (6, 1, 16)])
def test_serving_layer_outputs_and_keys_equal_the_training_model(heads, kv_heads, head_dim):
    H = 48
    cfg = SparrowConfig(hidden_size=H, num_attention_heads=heads, num_key_value_heads=kv_heads,
                        head_dim=head_dim, intermediate_size=80, vocab_size=30, anchor_tokens=2, window_tokens=5)
    torch.manual_seed(0)
    model = SparrowDraftModel(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, mean=1.0 if p.ndim == 1 else 0.0, std=0.3)  # norms too
    layer = SparrowServingLayer(model, max_positions=4096)
    n = 12
    hidden, embeds = torch.randn(n, H) * 3, torch.randn(n, H)
    positions = torch.randint(0, 4000, (n,)).sort().values
    mask = WindowSpec(2, 5).mask(torch.arange(n), torch.arange(n))
    seen = {}

    def attend_as(name):
        def attend(q, k, v):
            seen[name] = (q, k, v)
            g = heads // kv_heads
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1),
                v.repeat_interleave(g, 1).transpose(0, 1), attn_mask=mask).transpose(0, 1)
        return attend

    with torch.no_grad():
        ref = model(hidden, embeds, positions, attend_as("train"))
        out = layer(hidden, embeds, positions, attend_as("serve"))
    for a, b in zip(seen["serve"], seen["train"]):  # q, k (rotated), v
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
