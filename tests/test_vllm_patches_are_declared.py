"""Every patch of vLLM internals is a row of patches.PATCHES: what was applied is what the table
declares (the attribute it replaced, nothing undeclared, nothing missing on this platform), two
patches never replace one attribute, and docs/vllm-patches.md is the table as generated."""

import dataclasses
from pathlib import Path

import pytest
from vllm.platforms import current_platform

from vllm_sparrow import patches

DOC = Path(__file__).resolve().parents[1] / "docs" / "vllm-patches.md"


def test_applied_patches_are_the_declared_rows_for_this_platform():
    patches.apply_patches()  # idempotent; the plugin applied them when vLLM loaded
    here = [r.name for r in patches.PATCHES if r.platform == "any" or current_platform.is_cpu()]
    assert list(patches.APPLIED) == here
    for name, applied in patches.APPLIED.items():
        assert applied.target == patches.DECLARED[name].target
        if not isinstance(applied.owner, dict):  # replaced, not just recorded
            assert getattr(applied.owner, applied.attr) is not applied.original, name


def test_two_patches_of_one_attribute_are_refused(monkeypatch):
    patches.apply_patches()
    held = patches.APPLIED["use-eagle"]
    rival = dataclasses.replace(patches.DECLARED["use-eagle"], name="rival")
    monkeypatch.setitem(patches.DECLARED, "rival", rival)
    with pytest.raises(RuntimeError, match="'use-eagle' and 'rival' both replace"):
        patches._patch("rival", held.owner, held.attr, lambda original: original)
    with pytest.raises(RuntimeError, match="not declared"):
        patches._patch("undeclared", held.owner, "__repr__", lambda original: original)


def test_patch_list_in_docs_is_generated_from_the_table():
    assert patches.table_markdown() in DOC.read_text(), "regenerate: python -m vllm_sparrow.patches"
    assert len({r.target for r in patches.PATCHES}) == len(patches.PATCHES)


def test_file_url_without_allowed_path_maps_to_a_400_naming_the_flag_where_upstream_gave_a_500():
    """What the API server makes of the error (create_error_response is the status its handlers
    answer with): the fixed connector's error is a 400 that names the flag; upstream's own
    RuntimeError, still raised by the original it wraps, is a 500 (when that stops being so,
    vLLM has fixed it and the patch can go)."""
    from http import HTTPStatus

    from urllib3.util import parse_url
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.multimodal.media.connector import MediaConnector

    patches.apply_patches()
    connector = MediaConnector()  # as a server without --allowed-local-media-path builds it
    with pytest.raises(RuntimeError) as fixed:  # still upstream's type for offline callers
        connector.fetch_image("file:///srv/media/frame.png")
    answer = create_error_response(fixed.value).error
    assert answer.code == HTTPStatus.BAD_REQUEST and "--allowed-local-media-path" in answer.message, answer

    original = patches.APPLIED["local-media-errors"].original
    with pytest.raises(RuntimeError) as upstream:
        original(connector, parse_url("file:///srv/media/frame.png"), None)
    assert create_error_response(upstream.value).error.code == HTTPStatus.INTERNAL_SERVER_ERROR


def test_file_url_of_a_missing_file_in_the_allowed_folder_maps_to_a_400_naming_it(tmp_path):
    """The same for a file:// URL inside --allowed-local-media-path that names no file: upstream's
    decoder error is a 500; the fixed connector's is a 400 that names the file (vLLM masks paths)."""
    from http import HTTPStatus

    from urllib3.util import parse_url
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.multimodal.media.connector import MediaConnector
    from vllm.multimodal.media.image import ImageMediaIO
    from vllm.multimodal.media.video import VideoMediaIO

    patches.apply_patches()
    connector = MediaConnector(allowed_local_media_path=str(tmp_path))
    missing = (tmp_path / "missing.mp4").as_uri()
    with pytest.raises(FileNotFoundError) as fixed:  # still upstream's type for offline callers
        connector.fetch_video(missing)
    answer = create_error_response(fixed.value).error
    assert answer.code == HTTPStatus.BAD_REQUEST and "no file 'missing.mp4'" in answer.message, answer

    original = patches.APPLIED["local-media-errors"].original
    with pytest.raises(Exception) as upstream:
        original(connector, parse_url(missing), VideoMediaIO(ImageMediaIO()))
    assert create_error_response(upstream.value).error.code == HTTPStatus.INTERNAL_SERVER_ERROR


def test_num_frames_on_an_fps_driven_video_loader_warns_to_use_fps(caplog, monkeypatch):
    """vLLM's Qwen-VL video loaders ignore num_frames (the demo target's 32 s clip: 512 visual
    tokens with num_frames 8 or unset, 256 with fps 1); the first such video says so, naming fps.
    Loaders that take num_frames, and requests without it, stay quiet."""
    import logging

    from vllm.multimodal.media.image import ImageMediaIO
    from vllm.multimodal.media.video import VideoMediaIO

    patches.apply_patches()
    assert "video-num-frames-ignored" in patches.APPLIED
    VideoMediaIO.__init__.warned.clear()  # an earlier engine of this process may have warned already
    monkeypatch.setattr(logging.getLogger("vllm_sparrow"), "propagate", True)  # vLLM's logger: to caplog
    with caplog.at_level(logging.WARNING, logger="vllm_sparrow"):
        VideoMediaIO(ImageMediaIO(), video_backend="qwen2_vl")  # no num_frames: nothing to say
        VideoMediaIO(ImageMediaIO(), num_frames=8)  # the default loader takes num_frames
        assert "has no effect" not in caplog.text
        VideoMediaIO(ImageMediaIO(), num_frames=8, video_backend="qwen2_vl")
    assert "num_frames=8 in media_io_kwargs has no effect" in caplog.text and '"fps"' in caplog.text, caplog.text
