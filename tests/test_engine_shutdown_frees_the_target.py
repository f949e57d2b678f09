"""An engine's shutdown frees its target's weights even while the LLM object lives on.

vLLM's runner drops the target at shutdown (runner.shutdown sets model = None) so that the next
engine in the process gets the memory: `sparrow bench` opens one engine per method, and on one
GPU a 7B target left alive means the next engine cannot start. The Sparrow proposer, which the
runner keeps, holds the target's embedding and LM head weakly, so nothing of ours pins it.
"""

import gc
import weakref

from conftest import close_llm, make_llm


def _target_ref(worker):
    return weakref.ref(worker.model_runner.model)


def test_the_target_is_freed_when_a_sparrow_engine_shuts_down(target_dirs, trained_drafts):
    kind = "qwen2_5_vl"
    llm = make_llm(target_dirs(kind), max_model_len=2048, max_num_seqs=4, speculative_config={
        "method": "sparrow", "model": str(trained_drafts(kind)), "num_speculative_tokens": 3})
    from vllm import SamplingParams

    out = llm.generate(["describe the red square"], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    assert out[0].outputs[0].token_ids  # the target served through the proposer's token I/O
    target = llm.collective_rpc(_target_ref)[0]
    assert target() is not None
    close_llm(llm)  # `llm` is still referenced here, as in a bench between two engines
    gc.collect()
    assert target() is None, [type(r).__name__ for r in gc.get_referrers(target())][:8]
