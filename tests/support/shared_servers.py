"""`vllm serve` processes the test files of one unit share (tests/kinds.py GROUPS "servers" and
"v2_servers"): each server starts when a test first asks for it and stops when the worker moves
on to another unit (conftest's pytest_runtest_teardown), so the request-parameter matrix, the
Sparrow server's own tests and the local-media test start two servers between them, not four.

A server is a dict: url, client (the `openai` client, no retries: a 5xx is not resent), model
(the name requests give), target, pid, log, and clip (a 16-frame synthetic clip in its media folder)."""

import contextlib
import json
from pathlib import Path

KIND = "qwen2_5_vl"
SPEC_TOKENS = 3
MAX_FRAMES = 600  # the V1 servers' pyav max_frames
MAX_FRAME_PIXELS = 10_000_000  # the V1 servers' VLLM_MAX_IMAGE_PIXELS: 4K (8.3 MP) passes


class UnitServers:
    """Servers kept open for the rest of a unit, by name."""

    def __init__(self):
        self._stack = contextlib.ExitStack()
        self._open: dict[str, dict] = {}

    def get(self, name: str, start) -> dict:
        """The server called `name`, started with `start()` (a context manager) if not running."""
        if name not in self._open:
            self._open[name] = self._stack.enter_context(start())
        return self._open[name]

    def close(self) -> None:
        self._open.clear()
        self._stack.close()


UNIT_SERVERS = UnitServers()


@contextlib.contextmanager
def _served(target: Path, args: list[str], log: Path, env: dict, clip: Path, seed: int):
    """The server, after writing its 16-frame synthetic clip (seed) where its media folder is."""
    import openai
    from conftest import vllm_server

    from sparrow_world.synthetic_clip import write_synthetic_clip

    clip.parent.mkdir(exist_ok=True)
    write_synthetic_clip(clip, 16, seed=seed)
    with vllm_server(target, args, log, {"VLLM_CPU_KVCACHE_SPACE": "1", **env}) as (url, proc):
        yield dict(url=url, client=openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0),
                   model=str(target), target=target, pid=proc.pid, log=log, clip=clip)


def v1_server(workdir: Path, target: Path, draft: Path | None) -> dict:
    """The tiny Qwen2.5-VL target served on the installed vLLM (0.32 here), in float32, videos
    decoded by the plugin's PyAV backend (8 frames); with `draft`, speculating with Sparrow and
    reading local media from `clip`'s folder. Without a draft no local media path is allowed
    (test_local_media_without_allowed_path_gets_a_400.py needs it missing)."""
    media = workdir / "server-media"
    clip = media / "clip.mp4"  # written when the server starts (_served)
    args = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048",
            "--media-io-kwargs", json.dumps({"video": {"backend": "pyav", "num_frames": 8, "max_frames": MAX_FRAMES}}),
            "--limit-mm-per-prompt", json.dumps({"video": 1, "image": 1})]
    name = "plain"
    if draft is not None:
        name = "sparrow"
        spec = {"method": "sparrow", "model": str(draft), "num_speculative_tokens": SPEC_TOKENS}
        args += ["--speculative-config", json.dumps(spec), "--allowed-local-media-path", str(media),
                 "--per-request-spec-decode-metrics", "summary"]
    env = {"VLLM_MAX_IMAGE_PIXELS": str(MAX_FRAME_PIXELS)}
    return UNIT_SERVERS.get(f"v1-{name}", lambda: _served(target, args, workdir / f"server-{name}.log", env,
                                                          clip=clip, seed=7))


def v2_server(workdir: Path, target: Path, draft: Path | None) -> dict:
    """The tiny Qwen2.5-VL target served by vLLM 0.34 (the side environment's stand-in here), in
    float32, videos decoded by vLLM's opencv backend (8 frames), local media from `clip`'s folder;
    with `draft`, speculating with Sparrow's probabilistic drafts."""
    from support.lossless_batch import sparrow_spec

    media = workdir / "v034-media"
    clip = media / "clip.mp4"  # written when the server starts (_served)
    args = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "2048", "--allowed-local-media-path",
            str(media), "--media-io-kwargs", json.dumps({"video": {"backend": "opencv", "num_frames": 8}}),
            "--limit-mm-per-prompt", json.dumps({"video": 1, "image": 1})]
    name = "plain"
    if draft is not None:
        name = "sparrow"
        spec = {**sparrow_spec(draft), "draft_sample_method": "probabilistic"}
        args += ["--speculative-config", json.dumps(spec)]
    return UNIT_SERVERS.get(f"v2-{name}", lambda: _served(target, args, workdir / f"v034-server-{name}.log", {},
                                                          clip=clip, seed=3))
