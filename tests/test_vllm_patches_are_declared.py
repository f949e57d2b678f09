"""Every touch of vLLM internals is a row of patches.PATCHES: what was applied is what the table
declares (the attribute it replaced, nothing undeclared, nothing missing on this platform), two
patches never replace one attribute, every internal Sparrow reads without patching is present on
the installed vLLM, the method's patches and the general fixes are declared in their own modules,
and docs/vllm-patches.md is the table as generated."""

import dataclasses
from pathlib import Path

import pytest

from vllm_sparrow import LOGGER, glues, patch_helper, patches, read_check
from vllm_sparrow.v1_runner import method_patches, verify_fixes, vllm_fixes, vllm_reads
from vllm_sparrow.patch_helper import Read

DOC = Path(__file__).resolve().parents[1] / "docs" / "vllm-patches.md"


def test_applied_patches_are_the_declared_rows_for_this_platform():
    patches.apply_patches()  # idempotent; the plugin applied them when vLLM loaded
    here = [r.name for r in patches.PATCHES if r.kind == "replaces" and read_check.on_this_platform(r)]
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
        patch_helper.replace_attr("rival", held.owner, held.attr, lambda original: original)
    with pytest.raises(RuntimeError, match="not declared"):
        patch_helper.replace_attr("undeclared", held.owner, "__repr__", lambda original: original)
    read = next(r for r in patches.PATCHES if r.kind == "reads")
    with pytest.raises(RuntimeError, match="not declared"):  # a read row replaces nothing
        patch_helper.replace_attr(read.name, held.owner, "__repr__", lambda original: original)


def test_patch_list_in_docs_is_generated_from_the_table():
    assert glues.docs_markdown() in DOC.read_text(), "regenerate: python -m vllm_sparrow.glues"
    assert len({r.target for r in patches.PATCHES}) == len(patches.PATCHES)


def test_the_method_patches_and_the_general_fixes_are_declared_in_their_own_modules():
    """One table, joined from the rows each module declares beside its code: the method's patches
    (all required) in method_patches.py, the general fixes (all can be turned off) in
    vllm_fixes.py and verify_fixes.py, each with the internals its code reads; the V1 glue's other reads in
    vllm_reads.py; the shared modules' reads in shared_reads.py, which the V2 runner's table
    holds too."""
    from vllm_sparrow import shared_reads
    from vllm_sparrow.v2_runner import vllm_reads as v2_reads

    assert patches.PATCHES == (method_patches.ROWS + vllm_reads.ROWS + shared_reads.ROWS + vllm_fixes.ROWS
                               + verify_fixes.ROWS)
    assert v2_reads.ROWS[-len(shared_reads.ROWS):] == shared_reads.ROWS
    assert all(r.kind == "reads" and r.scope == "sparrow" for r in shared_reads.ROWS)
    for module, scope in ((method_patches, "sparrow"), (vllm_fixes, "fix"), (verify_fixes, "fix")):
        replaced = [r for r in module.ROWS if r.kind == "replaces"]
        assert replaced and all(r.scope == scope and r.apply.__module__ == module.__name__ for r in replaced)
        assert all(r.scope == scope for r in module.ROWS if r.kind == "reads")
    assert all(r.kind == "reads" and r.scope == "sparrow" for r in vllm_reads.ROWS)
    for module in (vllm_fixes, verify_fixes):
        fixes = {r.name for r in module.ROWS if r.kind == "replaces"}
        assert all(set(r.needs) <= fixes for r in module.ROWS)  # a fix's read follows that fix


def test_every_read_of_this_platform_is_present_on_the_installed_vllm():
    """Each internal Sparrow reads (or overrides) without patching it is where its row says on the
    installed vLLM (0.32 here; 0.33 is read from its source: test_patch_targets_exist_in_vllm_source),
    found as its check says: attribute, dataclass field, or assigned in the code of the class
    (instance attributes set in __init__)."""
    reads = [r for r in patches.PATCHES if r.kind == "reads" and read_check.on_this_platform(r)]
    assert len(reads) > 40
    assert read_check.missing_reads(reads) == []
    runner, proposer = "vllm.v1.worker.gpu_model_runner.GPUModelRunner", "vllm.v1.spec_decode.eagle.EagleProposer"
    for target in (f"{runner}.input_batch", f"{runner}.discard_request_mask", f"{proposer}.num_speculative_tokens",
                   f"{proposer}._enable_probabilistic_draft_probs",
                   "vllm.v1.attention.backend.CommonAttentionMetadata.query_start_loc"):
        assert target in patches.DECLARED, target


def test_the_read_check_finds_what_this_vllm_lacks():
    batch = "vllm.v1.worker.gpu_input_batch.InputBatch"
    absent = [Read(f"{batch}.renamed_array", "a test", "x", "instance"),
              Read(f"{batch}.req_ids", "a test", "x", "field"),  # a property, not a dataclass field
              Read("vllm.v1.attention.backend.CommonAttentionMetadata.renamed_field", "a test", "x", "field"),
              Read("vllm.v1.spec_decode.eagle.EagleProposer.renamed_method", "a test", "x", "class"),
              Read("vllm.v1.moved_module.Class.attr", "a test", "x", "class")]
    present = [Read(f"{batch}.token_ids_cpu", "a test", "x", "instance"),
               Read("vllm.v1.sample.metadata.SamplingMetadata.all_greedy", "a test", "x", "field"),
               Read("<a target model>.anything", "a test", "x", "documented")]
    assert read_check.missing_reads(absent + present) == absent
    with pytest.raises(ValueError, match="check 'guess'"):
        Read(f"{batch}.req_ids", "a test", "x", "guess")


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
    # the plugin's logger is under vLLM's "vllm", which stops propagation once vLLM configured it: to caplog
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        VideoMediaIO(ImageMediaIO(), video_backend="qwen2_vl")  # no num_frames: nothing to say
        VideoMediaIO(ImageMediaIO(), num_frames=8)  # the default loader takes num_frames
        assert "has no effect" not in caplog.text
        VideoMediaIO(ImageMediaIO(), num_frames=8, video_backend="qwen2_vl")
    assert "num_frames=8 in media_io_kwargs has no effect" in caplog.text and '"fps"' in caplog.text, caplog.text
