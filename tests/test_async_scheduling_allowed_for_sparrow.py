"""vLLM accepts async scheduling for sparrow as for EAGLE (patch async-scheduling-method).

Without the patch, asking for it fails the config check ("async scheduling is only supported
with EAGLE/MTP/..."), and when left unset vLLM turns it off for sparrow. The CPU platform then
turns it off for every method, so the lossless runs with async scheduling on are GPU-only.
"""

from vllm.engine.arg_utils import EngineArgs

from vllm_sparrow.patches import APPLIED


def test_async_scheduling_request_passes_vllms_config_check(target_dirs, trained_drafts):
    target, draft = target_dirs("qwen2_5_vl"), trained_drafts("qwen2_5_vl")
    args = EngineArgs(model=str(target), enforce_eager=True, dtype="float32", max_model_len=2048,
                      async_scheduling=True, speculative_config={
                          "method": "sparrow", "model": str(draft), "num_speculative_tokens": 3})
    config = args.create_engine_config()  # raised ValueError before the patch
    assert config.speculative_config.method == "sparrow"
    assert "async-scheduling-method" in APPLIED


def test_adaptive_length_steps_aside_under_async_scheduling_with_a_log_line():
    """Adaptive length hands vLLM per-request draft lengths (lists), which the runner refuses under
    async scheduling (it asserts a [B, K] tensor on the second decode step). The proposer serves
    fixed-length drafts there, says so once, and keeps the threshold where async is off."""
    import logging

    from vllm_sparrow import LOGGER
    from vllm_sparrow.drafting.choice import adaptive_length

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger(LOGGER)
    log.addHandler(handler)
    try:
        assert adaptive_length(0.7, async_scheduling=False) == 0.7
        assert adaptive_length(0.7, async_scheduling=None) == 0.7
        assert adaptive_length(None, async_scheduling=True) is None
        assert not lines
        assert adaptive_length(0.7, async_scheduling=True) is None
    finally:
        log.removeHandler(handler)
    assert len(lines) == 1 and "--no-async-scheduling" in lines[0] and "0.7" in lines[0]
