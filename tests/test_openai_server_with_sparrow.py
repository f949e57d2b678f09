"""`vllm serve TARGET --speculative-config '{"method": "sparrow", ...}'`: the real server on
127.0.0.1, talked to with the `openai` client. Video (data: and file:// URLs), image and text
requests are answered with speculation on, bad input gets a 4xx naming the problem while the
server keeps serving, and the Prometheus spec-decode counters move. That answers, streamed or
not, and many at once, equal the target's own (the server without speculation):
test_request_parameters_behave_as_without_sparrow.py, on the same two servers."""

import base64
import urllib.request
from pathlib import Path

import openai
import pytest
from conftest import TRAINED_TEXTS
from support.heavy_video import frames, peak_rss_mib
from support.shared_servers import MAX_FRAMES

from sparrow_world.synthetic_clip import write_synthetic_clip

MAX_TOKENS = 16


@pytest.fixture
def server(sparrow_server):
    """The unit's Sparrow server (support/shared_servers.py), local media read from its clip's folder."""
    return sparrow_server


def _video_part(url):
    return {"type": "video_url", "video_url": {"url": url}}


def _ask(server, content, **kw):
    return server["client"].chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": content}],
        max_tokens=MAX_TOKENS, temperature=0.0, **kw)


def _audio_only_mp4() -> bytes:
    """An mp4 holding one AAC audio stream and no video."""
    import io

    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        stream = c.add_stream("aac", rate=16000)
        stream.layout = "mono"
        for i in range(8):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            for packet in stream.encode(frame):
                c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    return buf.getvalue()


def _data_url(path: Path) -> str:
    return "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()


def test_video_image_and_text_chats_are_answered(server):
    text = [{"type": "text", "text": "describe the video"}]
    by_data = _ask(server, [_video_part(_data_url(server["clip"]))] + text)
    by_file = _ask(server, [_video_part(server["clip"].as_uri())] + text)
    assert by_data.choices[0].message.content == by_file.choices[0].message.content
    assert by_data.usage.prompt_tokens > 64  # 8 frames of video reached the model
    from io import BytesIO

    import numpy as np
    from PIL import Image

    buf = BytesIO()
    Image.fromarray(np.full((112, 112, 3), 120, np.uint8)).save(buf, format="PNG")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}}
    assert _ask(server, [image, {"type": "text", "text": "what is in the picture"}]).choices[0].message.content
    assert _ask(server, TRAINED_TEXTS[0]).usage.completion_tokens == MAX_TOKENS


@pytest.mark.parametrize("case", ["corrupt video", "truncated video", "file outside allowed path",
                                  "too many tokens", "empty prompt", "audio-only file", "two videos",
                                  "unsupported codec"])
def test_bad_input_gets_a_4xx_and_the_server_keeps_serving(server, case, tmp_path):
    raw = server["clip"].read_bytes()
    bad = {
        "corrupt video": [_video_part("data:video/mp4;base64," + base64.b64encode(b"\x00junk" * 99).decode()),
                          {"type": "text", "text": "x"}],
        "truncated video": [_video_part("data:video/mp4;base64," + base64.b64encode(raw[: len(raw) // 3]).decode()),
                            {"type": "text", "text": "x"}],
        "file outside allowed path": [_video_part(write_synthetic_clip(tmp_path / "x.mp4", 4).as_uri()),
                                      {"type": "text", "text": "x"}],
        "too many tokens": "word " * 3000,
        "empty prompt": [{"type": "text", "text": "   "}],
        "audio-only file": [_video_part("data:video/mp4;base64," + base64.b64encode(_audio_only_mp4()).decode()),
                            {"type": "text", "text": "x"}],
        "two videos": [_video_part(_data_url(server["clip"])), _video_part(_data_url(server["clip"])),
                       {"type": "text", "text": "x"}],
        # an intact mp4 whose video sample entry names a codec no decoder knows ("zzzz")
        "unsupported codec": [_video_part("data:video/mp4;base64," + base64.b64encode(raw.replace(b"avc1", b"zzzz")).decode()),
                              {"type": "text", "text": "x"}],
    }[case]
    with pytest.raises(openai.APIStatusError) as err:
        _ask(server, bad)
    assert 400 <= err.value.status_code < 500, (case, err.value)
    hint = {"corrupt video": "cannot decode as video", "truncated video": "cannot decode as video",
            "file outside allowed path": "allowed-local-media-path", "too many tokens": "maximum context length",
            "empty prompt": "empty prompt", "audio-only file": "no video stream", "two videos": "At most 1 video",
            "unsupported codec": "unsupported video codec"}
    assert hint[case] in str(err.value), str(err.value)
    assert _ask(server, "still there?").choices[0].message.content is not None


def test_a_4k_clip_is_answered_without_the_server_holding_its_frames(server, tmp_path):
    """4 s of 3840x2160 at 30 fps (a small file of huge frames): decoding keeps only the 8 sampled
    frames, scaled to 1 MP while decoding, so the server's peak memory grows far below 1 GiB."""
    from vllm_sparrow.video import write_frames

    clip = write_frames(tmp_path / "4k.mp4", frames(120, 3840, 2160), fps=30)
    before = peak_rss_mib(server["pid"])
    reply = _ask(server, [_video_part(_data_url(clip)), {"type": "text", "text": "describe the video"}])
    grown = peak_rss_mib(server["pid"]) - before
    print(f"4K clip: the API server's peak memory grew by {grown:.0f} MiB")
    assert reply.choices[0].message.content is not None
    assert grown < 512, f"the API server's peak memory grew by {grown:.0f} MiB"


@pytest.mark.parametrize("case", ["frames too large", "too many frames"])
def test_videos_over_a_decode_limit_get_a_400_naming_it(server, tmp_path, case):
    from vllm_sparrow.video import write_frames

    if case == "frames too large":  # 4096 x 4096 = 16.8 MP > VLLM_MAX_IMAGE_PIXELS
        clip, hint = write_frames(tmp_path / "big.mp4", frames(2, 4096, 4096), fps=1), "VLLM_MAX_IMAGE_PIXELS"
    else:  # a tiny clip with more frames than the server's max_frames
        clip, hint = write_frames(tmp_path / "long.mp4", frames(MAX_FRAMES + 100, 64, 64), fps=100), "max_frames"
    with pytest.raises(openai.APIStatusError) as err:
        _ask(server, [_video_part(_data_url(clip)), {"type": "text", "text": "x"}])
    assert err.value.status_code == 400 and hint in str(err.value), str(err.value)
    assert _ask(server, "still there?").choices[0].message.content is not None


def test_prometheus_spec_decode_counters_move(server):
    def counters():
        with urllib.request.urlopen(server["url"] + "/metrics") as r:
            text = r.read().decode()
        return {name: sum(float(l.split()[-1]) for l in text.splitlines()
                          if l.startswith(name) and not l.startswith("#"))
                for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens")}

    before = counters()
    _ask(server, TRAINED_TEXTS[1])  # a prompt the test draft was distilled on
    after = counters()
    assert after["vllm:spec_decode_num_drafts"] > before["vllm:spec_decode_num_drafts"]
    assert after["vllm:spec_decode_num_accepted_tokens"] > before["vllm:spec_decode_num_accepted_tokens"]


def test_per_request_spec_decode_metrics_are_reported(server):
    """The per-request counters agree with the reply: each verify step yields its accepted drafts
    plus one token, the prefill one more, and the last step may overshoot max_tokens by up to K
    tokens that are dropped."""
    reply = _ask(server, TRAINED_TEXTS[1], extra_body={"ignore_eos": True})
    spec = (reply.model_extra.get("metrics") or {}).get("speculative_decoding")
    assert spec["num_spec_tokens"] == 3 and spec["num_spec_steps"] > 0
    produced = reply.usage.completion_tokens
    upper = 1 + spec["num_spec_steps"] + spec["num_accepted_draft_tokens"]
    assert produced == MAX_TOKENS and upper - 3 <= produced <= upper, (produced, spec)
    # a prompt the test draft was distilled on: most drafts are accepted
    assert spec["num_accepted_draft_tokens"] > spec["num_spec_steps"]
