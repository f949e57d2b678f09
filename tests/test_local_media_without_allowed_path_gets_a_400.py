"""A `file://` media URL sent to a server started without `--allowed-local-media-path` gets a 400
that names the flag, and the server answers the next request on the same client (patch
local-media-errors; vLLM 0.32 answered a 500 and dropped the connection).

The server without speculation the unit shares (support/shared_servers.py), started without the
flag: the flag is what matters (the sparrow server is started with it), and the fix is in vLLM's
media loading, which every server shares."""

import openai
import pytest

from sparrow_world.synthetic_clip import write_synthetic_clip


@pytest.fixture
def server(plain_server):
    return plain_server


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
