"""Every request parameter a user sends over HTTP behaves with Sparrow as without speculation
(issue 61's matrix, support/request_matrix.py): the unit's two `vllm serve` processes (the tiny
target in float32 on the installed vLLM, one with Sparrow, support/shared_servers.py) each get
the 41 request forms at once from the `openai` client. Greedy answers are equal (text, logprobs,
logprobs of named ids, top-k logprobs beside them, structured outputs, usage), seeded sampling
repeats itself, bad values get the same 400 on both; streams carry the same text and usage, and
a cancelled stream leaves the server serving. The V2 runner's side:
test_v2_runner_request_parameters_behave_as_without_sparrow.py."""

import pytest
from conftest import TRAINED_TEXTS
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

PROMPT = TRAINED_TEXTS[0]  # a prompt the test draft was distilled on: its drafts are accepted
NAMES = [c.name for c in cases(list(range(MAX_TOKENS)), "a few words of text")]


@pytest.fixture(scope="module")
def matrix(plain_server, sparrow_server):
    sent = cases(*base_answer(plain_server, PROMPT))
    video = data_url(sparrow_server["clip"])
    return ({c.name: c for c in sent}, answers(plain_server, sent, PROMPT, video),
            answers(sparrow_server, sent, PROMPT, video))


@pytest.mark.parametrize("name", NAMES)
def test_each_request_parameter_answers_as_without_sparrow(matrix, name):
    by_name, plain, sparrow = matrix
    check_answers(by_name[name], plain[name], sparrow[name])


def test_streams_carry_the_same_text_and_usage(plain_server, sparrow_server):
    check_streams(plain_server, sparrow_server, PROMPT)


def test_a_cancelled_stream_leaves_the_server_serving(plain_server, sparrow_server):
    check_cancelled_stream(plain_server, sparrow_server, PROMPT)
