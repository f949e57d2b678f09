"""Every request parameter a user sends over HTTP behaves with Sparrow as without speculation
(issue 61's matrix, support/request_matrix.py): the unit's two `vllm serve` processes (the tiny
target in float32 on the installed vLLM, one with Sparrow, support/shared_servers.py) get the
same requests from the `openai` client. Greedy answers are equal (text, logprobs, logprobs of
named ids, structured outputs, usage), seeded sampling repeats itself, bad values get the same
400 on both, streams carry the same text and usage, a cancelled stream leaves the server
serving, and 24 concurrent requests get the answers they get alone. The V2 runner's side:
test_v2_runner_request_parameters_behave_as_without_sparrow.py."""

import pytest
from conftest import TRAINED_TEXTS
from support.request_matrix import (
    MAX_TOKENS,
    case_named,
    cases,
    check_cancelled_stream,
    check_case,
    check_concurrent,
    check_streams,
)

PROMPT = TRAINED_TEXTS[0]  # a prompt the test draft was distilled on: its drafts are accepted
NAMES = [c.name for c in cases(list(range(MAX_TOKENS)), "a few words of text")]
MIX = ["greedy with logprobs", "video greedy with logprobs", "logprob_token_ids", "logit_bias", "stop strings",
       "json_schema"]


@pytest.mark.parametrize("name", NAMES)
def test_each_request_parameter_answers_as_without_sparrow(plain_server, sparrow_server, name):
    check_case(plain_server, sparrow_server, case_named(plain_server, PROMPT, name), PROMPT)


def test_streams_carry_the_same_text_and_usage(plain_server, sparrow_server):
    check_streams(plain_server, sparrow_server, PROMPT)


def test_a_cancelled_stream_leaves_the_server_serving(plain_server, sparrow_server):
    check_cancelled_stream(plain_server, sparrow_server, PROMPT)


def test_24_concurrent_requests_get_their_answers(plain_server, sparrow_server):
    """Text and video requests, named-id and top-k logprobs, bias and schema, all at once."""
    check_concurrent(plain_server, sparrow_server, PROMPT, MIX, copies=4)
