"""A `file://` media URL sent to a server started without `--allowed-local-media-path` gets a 400
that names the flag, and the server answers the next request on the same client (patch
local-media-errors; vLLM 0.32 answered a 500 and dropped the connection).

A server of its own, without speculation: the flag is what matters (the sparrow server of
test_openai_server_with_sparrow.py is started with it), and the fix is in vLLM's media loading,
which every server shares."""

import json

import openai
import pytest
from conftest import vllm_server

from sparrow_world.synthetic_clip import write_synthetic_clip

KIND = "qwen2_5_vl"


@pytest.fixture(scope="module")
def server(workdir, target_dirs):
    target = target_dirs(KIND)
    args = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048",
            "--media-io-kwargs", json.dumps({"video": {"backend": "pyav", "num_frames": 4}}),
            "--limit-mm-per-prompt", json.dumps({"video": 1, "image": 1})]
    with vllm_server(target, args, workdir / "server-no-local-media.log", {"VLLM_CPU_KVCACHE_SPACE": "1"}) as (url, _):
        # no retries: the openai client would otherwise resend a request answered with a 5xx
        yield dict(client=openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0), model=str(target))


def _ask(server, content):
    return server["client"].chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0.0)


def test_file_url_without_the_flag_gets_a_400_naming_it_and_the_server_keeps_serving(server, tmp_path):
    clip = write_synthetic_clip(tmp_path / "clip.mp4", 4)  # a real clip: only the flag is missing
    with pytest.raises(openai.APIStatusError) as err:
        _ask(server, [{"type": "video_url", "video_url": {"url": clip.as_uri()}},
                      {"type": "text", "text": "describe the video"}])
    assert err.value.status_code == 400, err.value
    assert "--allowed-local-media-path" in err.value.message, err.value.message
    assert _ask(server, "still there?").choices[0].message.content is not None
