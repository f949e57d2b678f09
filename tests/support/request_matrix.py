"""The request parameters a vLLM user sends over HTTP, as one table (issue 61's matrix): each
case is sent to a server without speculation and one with Sparrow, and the answers compared.

What "the same" means per case (Case.expect):
  same        greedy: equal text, finish and stop reasons, token logprobs (and their top
              alternatives) within LOGPROB_ATOL, equal usage
  repeatable  seeded sampling: each server answers, and answers the same request twice alike
              (a speculating server draws its randomness in another order, so its sample is
              not the plain server's; test_lossless_sampling_matrix.py checks distributions)
  400         bad values: both servers answer 400 with the same message
"""

import base64
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

LOGPROB_ATOL = 1e-4  # float32, the same tokens scored in a verify batch of K + 1 rows
MAX_TOKENS = 24
# fields of an answer that differ between any two calls (ids, clocks) or between the servers by
# design (Sparrow's server reports per-request spec-decode metrics)
VOLATILE = {"id", "created", "system_fingerprint", "metrics"}


@dataclass(frozen=True)
class Case:
    name: str
    request: dict  # the openai client's keyword arguments besides model, messages / prompt
    endpoint: str = "chat"  # "chat" or "completions"
    video: bool = False  # a chat whose message starts with the served clip
    expect: str = "same"  # "same", "repeatable" or "400" (the module docstring)
    v2_skip: str = ""  # why vLLM 0.34's CPU stand-in cannot serve it (skipped there, saying so)
    v2_refused: str = ""  # the parameter vLLM 0.34 refuses with speculation (400 naming it)
    messages: list = field(default_factory=list)  # chat turns after the user's (continue_final_message)


STRUCTURED = "structured outputs error on the 0.34 stand-in and the request after hangs (docs/verified-where.md)"


def cases(base: list[int], text: str) -> list[Case]:
    """The matrix, its token ids and strings picked from the plain server's greedy answer to the
    text prompt: `base` its token ids, `text` its text (a stop token it writes, a word to ban...)."""
    g = dict(temperature=0.0, max_tokens=MAX_TOKENS)
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}, "n": {"type": "integer", "maximum": 9}},
              "required": ["color", "n"], "additionalProperties": False}
    return [
        Case("greedy with logprobs", dict(**g, logprobs=True, top_logprobs=5)),
        Case("video greedy with logprobs", dict(**g, logprobs=True, top_logprobs=3), video=True),
        Case("prompt_logprobs", dict(**g, extra_body={"prompt_logprobs": 2})),
        Case("logprob_token_ids", dict(**g, logprobs=True, extra_body={"logprob_token_ids": [base[1], 13, 277]})),
        Case("video logprob_token_ids", dict(**g, logprobs=True, extra_body={"logprob_token_ids": [base[2], 13]}),
             video=True),
        Case("completions logprob_token_ids", dict(**g, logprobs=2, extra_body={"logprob_token_ids": [base[1], 13]}),
             endpoint="completions"),
        Case("completions echo with logprobs", dict(**g, echo=True, logprobs=2), endpoint="completions"),
        Case("stop strings", dict(**g, stop=[text[6:9], "\n"])),
        Case("stop_token_ids", dict(**g, extra_body={"stop_token_ids": [base[6]]})),
        Case("stop string kept in output", dict(**g, stop=[text[6:9]], extra_body={"include_stop_str_in_output": True})),
        Case("min_tokens", dict(**g, extra_body={"min_tokens": 12, "stop_token_ids": [base[2]]})),
        Case("max_tokens=1", dict(temperature=0.0, max_tokens=1, logprobs=True)),
        Case("ignore_eos", dict(**g, extra_body={"ignore_eos": True})),
        Case("presence_penalty", dict(**g, presence_penalty=2.0)),
        Case("frequency_penalty", dict(**g, frequency_penalty=2.0)),
        Case("repetition_penalty", dict(**g, extra_body={"repetition_penalty": 1.8})),
        Case("allowed_token_ids", dict(**g, extra_body={"allowed_token_ids": sorted(set(base[::2]))})),
        Case("bad_words", dict(**g, extra_body={"bad_words": [text.split()[1]]})),
        Case("logit_bias", dict(**g, logit_bias={str(base[3]): -100, str(base[6]): 5}), v2_refused="logit_bias"),
        Case("video logit_bias", dict(**g, logit_bias={str(base[3]): -100}), video=True, v2_refused="logit_bias"),
        Case("json_schema", dict(**g, response_format={"type": "json_schema",
                                                       "json_schema": {"name": "shape", "schema": schema}}),
             v2_skip=STRUCTURED),
        Case("json_object", dict(**g, response_format={"type": "json_object"}), v2_skip=STRUCTURED),
        Case("regex", dict(**g, extra_body={"structured_outputs": {"regex": "(red|blue) [a-z ]{4,20}"}}),
             v2_skip=STRUCTURED),
        Case("choice", dict(**g, extra_body={"structured_outputs": {"choice": ["a red square", "a blue circle"]}}),
             v2_skip=STRUCTURED),
        Case("grammar", dict(**g, extra_body={"structured_outputs": {
            "grammar": 'root ::= ("red" | "blue") " " ("square" | "circle")'}}), v2_skip=STRUCTURED),
        Case("continue_final_message", dict(**g, extra_body={"continue_final_message": True,
                                                             "add_generation_prompt": False}),
             messages=[{"role": "assistant", "content": "the red"}]),
        Case("beam search", dict(temperature=0.0, max_tokens=12, n=2, extra_body={"use_beam_search": True})),
        Case("seeded sampling", dict(temperature=1.0, max_tokens=MAX_TOKENS, seed=7), expect="repeatable"),
        Case("seeded n=2, top_p and top_k", dict(temperature=0.9, top_p=0.8, max_tokens=MAX_TOKENS, n=2, seed=3,
                                                 extra_body={"top_k": 20}), expect="repeatable"),
        Case("seeded min_p", dict(temperature=0.8, max_tokens=MAX_TOKENS, seed=5, extra_body={"min_p": 0.1}),
             expect="repeatable", v2_refused="min_p"),
        Case("negative temperature", dict(temperature=-1.0, max_tokens=4), expect="400"),
        Case("top_p above 1", dict(temperature=1.0, top_p=1.5, max_tokens=4), expect="400"),
        Case("min_p above 1", dict(temperature=1.0, max_tokens=4, extra_body={"min_p": 1.5}), expect="400"),
        Case("top_logprobs above 20", dict(temperature=0.0, max_tokens=4, logprobs=True, top_logprobs=50), expect="400"),
        Case("logprob_token_ids without logprobs", dict(temperature=0.0, max_tokens=4,
                                                        extra_body={"logprob_token_ids": [13]}), expect="400"),
        Case("logit_bias out of the vocabulary", dict(temperature=0.0, max_tokens=4, logit_bias={"1000000000": 5}),
             expect="400"),
        Case("min_tokens above max_tokens", dict(temperature=0.0, max_tokens=4, extra_body={"min_tokens": 8}),
             expect="400"),
        Case("n=0", dict(temperature=0.0, max_tokens=4, n=0), expect="400"),
        Case("n=3 at temperature 0", dict(temperature=0.0, max_tokens=4, n=3), expect="400"),
        Case("max_tokens=0", dict(temperature=0.0, max_tokens=0), expect="400"),
        Case("a regex that does not parse", dict(temperature=0.0, max_tokens=4,
                                                 extra_body={"structured_outputs": {"regex": "(("}}),
             expect="400", v2_skip=STRUCTURED),
    ]


def data_url(path) -> str:
    return "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()


def send(server, case: Case, prompt: str, video_url: str | None = None) -> dict:
    """The case's request to `server` (support/shared_servers.py): the answer as a dict, or
    {"status": code, "message": text} for an HTTP error."""
    import openai

    request = dict(case.request)
    try:
        if case.endpoint == "completions":
            reply = server["client"].completions.create(model=server["model"], prompt=prompt, **request)
        else:
            content = prompt if not case.video else [{"type": "video_url", "video_url": {"url": video_url}},
                                                     {"type": "text", "text": prompt}]
            messages = [{"role": "user", "content": content}, *case.messages]
            reply = server["client"].chat.completions.create(model=server["model"], messages=messages, **request)
    except openai.APIStatusError as err:
        return {"status": err.status_code, "message": err.message}
    return reply.model_dump()


def assert_same(plain, sparrow, path: str = "answer") -> None:
    """Equal answers: every field alike but VOLATILE ones, floats (logprobs) within LOGPROB_ATOL."""
    if isinstance(plain, dict) and isinstance(sparrow, dict):
        keys = (plain.keys() | sparrow.keys()) - VOLATILE
        for key in sorted(keys):
            assert key in plain and key in sparrow, f"{path}.{key} only on one server"
            assert_same(plain[key], sparrow[key], f"{path}.{key}")
    elif isinstance(plain, list) and isinstance(sparrow, list):
        assert len(plain) == len(sparrow), f"{path}: {len(plain)} items without Sparrow, {len(sparrow)} with"
        for i, (a, b) in enumerate(zip(plain, sparrow)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(plain, float) and isinstance(sparrow, float):
        assert abs(plain - sparrow) <= LOGPROB_ATOL, f"{path}: {plain} without Sparrow, {sparrow} with"
    else:
        assert plain == sparrow, f"{path}: {plain!r} without Sparrow, {sparrow!r} with"


def choices_text(answer: dict) -> list[str]:
    return [c.get("text") if "text" in c else c["message"]["content"] for c in answer["choices"]]


_BASE: dict[str, tuple] = {}


def base_answer(server, prompt: str) -> tuple[list[int], str]:
    """The server's greedy answer to `prompt`: its token ids and text (asked once per server)."""
    if (server["url"], prompt) not in _BASE:
        reply = server["client"].chat.completions.create(
            model=server["model"], messages=[{"role": "user", "content": prompt}], temperature=0.0,
            max_tokens=MAX_TOKENS, logprobs=True, extra_body={"return_tokens_as_token_ids": True})
        ids = [int(t.token.split(":")[1]) for t in reply.choices[0].logprobs.content]
        _BASE[server["url"], prompt] = ids, reply.choices[0].message.content
    return _BASE[server["url"], prompt]


def case_named(plain_server, prompt: str, name: str) -> Case:
    return next(c for c in cases(*base_answer(plain_server, prompt)) if c.name == name)


def answers(server, sent: list[Case], prompt: str, video_url: str) -> dict[str, list[dict]]:
    """Every case sent at once, a thread each (a repeatable case twice): {case name: answers}.
    Batched together, each request's answer must still be the one it gets alone (greedy and
    seeded), whatever shares its steps; and the stand-in's interpreter runs one batch, not 41."""
    jobs = [c for c in sent for _ in range(2 if c.expect == "repeatable" else 1)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        replies = list(pool.map(lambda c: send(server, c, prompt, video_url), jobs))
    by_name: dict[str, list[dict]] = {}
    for case, reply in zip(jobs, replies):
        by_name.setdefault(case.name, []).append(reply)
    return by_name


def check_answers(case: Case, plain: list[dict], sparrow: list[dict], refused: str = "") -> None:
    """One case's answers alike on both servers, as Case.expect says; `refused`: the parameter the
    Sparrow server refuses instead (a 400 naming it), while the plain server answers."""
    if case.expect == "400":
        assert plain[0].get("status") == 400, plain[0]
        assert sparrow[0] == plain[0]
        return
    assert all("status" not in a for a in plain), plain
    if refused:
        assert sparrow[0].get("status") == 400 and refused in sparrow[0]["message"], sparrow[0]
        return
    assert all("status" not in a for a in sparrow), sparrow
    if case.expect == "repeatable":  # each server repeats itself; both give as many choices
        assert choices_text(sparrow[1]) == choices_text(sparrow[0]), sparrow
        assert choices_text(plain[1]) == choices_text(plain[0]), plain
        assert len(sparrow[0]["choices"]) == len(plain[0]["choices"])
        return
    assert_same(plain[0], sparrow[0])
    top = case.request.get("top_logprobs")
    if top:  # vLLM 0.32 once answered a step's top-k requests with another request's named ids
        for answer in (plain[0], sparrow[0]):
            assert {len(p["top_logprobs"]) for p in answer["choices"][0]["logprobs"]["content"]} == {top}, case.name


def streamed(server, prompt: str, **request) -> tuple[str, dict]:
    """A streamed chat's text and its usage (stream_options include_usage)."""
    stream = server["client"].chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": prompt}], stream=True,
        stream_options={"include_usage": True}, **request)
    text, usage = "", None
    for chunk in stream:
        text += "".join(c.delta.content or "" for c in chunk.choices)
        usage = chunk.usage or usage
    return text, usage.model_dump()


def check_streams(plain_server, sparrow_server, prompt: str) -> None:
    request = dict(temperature=0.0, max_tokens=MAX_TOKENS)
    plain, sparrow = streamed(plain_server, prompt, **request), streamed(sparrow_server, prompt, **request)
    assert sparrow == plain
    assert plain[0] == base_answer(plain_server, prompt)[1] and plain[1]["completion_tokens"] == MAX_TOKENS


def check_cancelled_stream(plain_server, sparrow_server, prompt: str) -> None:
    """A client that closes its stream after two chunks: the request is aborted, and the next
    request gets the answer it gets from the plain server."""
    stream = sparrow_server["client"].chat.completions.create(
        model=sparrow_server["model"], messages=[{"role": "user", "content": prompt}], stream=True,
        temperature=0.0, max_tokens=500, extra_body={"ignore_eos": True})
    for _, _chunk in zip(range(2), stream):
        pass
    stream.close()
    case = case_named(plain_server, prompt, "greedy with logprobs")
    assert_same(send(plain_server, case, prompt), send(sparrow_server, case, prompt))
