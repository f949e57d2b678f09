"""`vllm serve TARGET --data-parallel-size 2 --speculative-config '{"method": "sparrow", ...}'` on
this CPU build: vLLM's own scale-out (two engine cores behind two API servers, its DP
coordinator balancing requests) serves video requests with the Sparrow draft in each engine:
both engines receive requests and draft, and every answer to the same greedy request is the
same, whichever engine served it."""

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from conftest import vllm_server

from sparrow_world.synthetic_clip import write_synthetic_clip

KIND = "qwen2_5_vl"
REQUESTS = 8


@pytest.fixture(scope="module")
def server(workdir, target_dirs, trained_drafts):
    target, draft = target_dirs(KIND), trained_drafts(KIND)
    media = workdir / "dp-media"
    media.mkdir(exist_ok=True)
    clip = write_synthetic_clip(media / "clip.mp4", 8, seed=5)
    spec = {"method": "sparrow", "model": str(draft), "num_speculative_tokens": 3}
    args = ["--data-parallel-size", "2", "--enforce-eager", "--dtype", "float32", "--max-model-len", "2048",
            "--speculative-config", json.dumps(spec), "--allowed-local-media-path", str(media),
            "--limit-mm-per-prompt", json.dumps({"video": 1, "image": 0})]
    with vllm_server(target, args, workdir / "dp-server.log", {"VLLM_CPU_KVCACHE_SPACE": "1"}) as (url, _):
        yield url, str(target), clip


def _ask(url, model, clip):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    content = [{"type": "video_url", "video_url": {"url": clip.as_uri()}}, {"type": "text", "text": "what moves?"}]
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                           max_tokens=16, temperature=0.0)
    return reply.choices[0].message.content


def test_both_engines_serve_with_the_draft_and_answer_alike(server):
    url, model, clip = server
    with ThreadPoolExecutor(REQUESTS) as pool:
        answers = list(pool.map(lambda _: _ask(url, model, clip), range(REQUESTS)))
    assert len(set(answers)) == 1 and answers[0], answers
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()

    def per_engine(name):
        found = re.findall(rf'^vllm:{name}\{{engine="(\d+)"[^}}]*\}} ([\d.e+]+)$', metrics, re.M)
        totals = {}
        for engine, value in found:  # summed over the other labels (finish reasons)
            totals[engine] = totals.get(engine, 0.0) + float(value)
        return totals

    drafts = per_engine("spec_decode_num_drafts_total")
    served = per_engine("request_success_total")
    assert set(drafts) == {"0", "1"} and min(drafts.values()) > 0, drafts
    assert set(served) == {"0", "1"} and min(served.values()) > 0 and sum(served.values()) == REQUESTS, served
