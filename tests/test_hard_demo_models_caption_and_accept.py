"""The hard world's shipped models (models/world-hard, issue 29): the target reads from the video
the words that have one right answer, far above what a blank video gives; its drafts are as
unsure as drafts of real captioners (the EAGLE-style baseline's acceptance at K = 5 in vLLM, on
the bench's 512-token clips, in the range real video captioners give); `make demo` (this world) gives the target's captions with
Sparrow, token for token."""

import json
from pathlib import Path

import pytest
from conftest import DEMO_MODELS

HARD = Path(DEMO_MODELS).parent / "world-hard"


@pytest.fixture(scope="module")
def target_eval():
    """Teacher-forced accuracy per word kind on 16 held-out 16 s clips, real and blank video."""
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    from sparrow_world.demo.target_data import WorldBatches
    from sparrow_world.demo.train_target import EVAL_SEED0, evaluate
    from sparrow_world.tiny_targets import make_prompt
    from sparrow_world.world import WorldConfig
    from sparrow_world.world.languages import language

    target = str(HARD / "target")
    tok = AutoTokenizer.from_pretrained(target)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(target, dtype=torch.float32)
    words = language("hard")
    data = WorldBatches(tok, make_prompt("qwen2_5_vl", tok, words.prompt, media="video"), words)
    samples = [data.sample(EVAL_SEED0 + 500 + i, WorldConfig(duration_s=16)) for i in range(16)]
    return evaluate(model, data, samples, batch_size=8)


def test_hard_target_needs_the_video(target_eval):
    """Colour (which colour comes next) and shape have one right word each: read from the video.
    Sizes and motions have synonyms, so their exact-word accuracy is capped by the choice; they
    still beat the blank video. Colour is held by the errors the video removes, not a fixed margin:
    the long stage taught the target more of the colour prior (blank 0.42 -> 0.47) while its
    errors with the video stayed a fifteenth of the blank video's (0.04 / 0.58 -> 0.035 / 0.53)."""
    real, blank = target_eval["acc"], target_eval["acc_blank"]
    assert real["colour"] > 0.8 and 1 - real["colour"] < 0.2 * (1 - blank["colour"]), (real, blank)
    assert real["shape"] > 0.6 and real["shape"] > blank["shape"] + 0.3, (real, blank)
    for kind in ("size", "motion"):
        assert real[kind] > blank[kind] + 0.05, (kind, real, blank)


def _depth5(replay: dict) -> float:
    """Acceptance length (bonus included) at K = 5 from a replay at a deeper K."""
    return 1 + sum(replay["per_position"][:5]) / replay["drafts"]


def test_hard_world_drafts_are_as_unsure_as_real_captioners(tmp_path):
    """The issue's calibration, measured where it is defined: `sparrow bench --world hard --k 5`
    at 512 visual tokens, batch 1 (the published run's first cell), the EAGLE-style chain draft
    accepts 3.0-4.4 tokens per step (real captioners: about 3.3-4.2). The build record's
    teacher-forced replay reads higher (it drafts from the target's exact states on eight
    clips: 4.57 at K = 5 against the bench's 3.96), so it only checks that Sparrow is no worse
    than EAGLE at short videos."""
    import subprocess
    import sys

    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", "bench", "--world", "hard", "--k", "5",
                           "--lengths", "512", "--methods", "eagle", "--rounds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (eagle,) = [r for r in json.loads((out / "results.json").read_text())["records"] if r["method"] == "eagle"]
    assert eagle["clips"] == 2 and 3.0 <= eagle["acceptance_length"] <= 4.4, eagle["acceptance_length"]
    build = json.loads((HARD / "build.json").read_text())
    assert _depth5(build["sparrow_heldout_replay"]) >= _depth5(build["eagle_heldout_replay"]) - 0.3


def test_make_demo_captions_with_sparrow_equal_the_targets_on_the_sample_videos(tmp_path):
    """`make demo` as a user runs it (the hard world, the default), here from another folder (the
    shipped models are found from anywhere): the report on the terminal, each of the 3 captions
    identical to the target's greedy one and scored by the facts it gets right; vLLM's own output
    (Python logs, C++ warnings, progress bars) in the log file; exit status 0."""
    import subprocess
    import sys

    log = tmp_path / "vllm.log"
    done = subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", "demo", "--max-tokens", "160", "--log", str(log)],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "caption with sparrow" in done.stdout and "mean acceptance length" in done.stdout
    assert done.stdout.count("identical to the target's greedy caption") == 3, done.stdout
    assert "facts right" in done.stdout, done.stdout
    assert "Initializing a V1 LLM engine" not in done.stdout + done.stderr
    text = log.read_text()
    assert "Initializing a V1 LLM engine" in text
    # the plugin's own lines sit in vLLM's log beside vLLM's (its logger is under vLLM's "vllm")
    assert "Sparrow draft" in text and "V1 runner glue" in text and "vLLM patches applied" in text, text[-3000:]
