"""`sparrow respond` (vllm_sparrow.training.respond): vLLM writes the target's own greedy answers
into a copy of a training JSONL, token for token what transformers' generate() (HFTarget.answer,
capture's reference path) writes, for video, conversations-shaped and text-only samples; a capture
of that file stores exactly those tokens; bad lines and lines with a response of their own are
copied through unchanged (--regenerate answers the latter too); a `sparrow respond` killed with
SIGKILL while writing an answer, once rerun, gives the file an uninterrupted run gives, each
answer once; one killed while writing the output leaves none, and its rerun writes it; a rerun
with nothing left starts no engine."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from support.clip_data import clip_rows
from conftest import ENGINE_DEFAULTS, close_llm, make_llm

from vllm_sparrow.training.respond import RespondConfig, respond, work_file

KIND = "qwen2_5_vl"
FRAMES = 4
MAX_NEW = 24
EXTRA = [
    {"prompt": "describe the red square moving left"},  # text-only
    "{not json",  # bad json: copied through
    {"video": "missing.mp4", "prompt": "what is this"},  # missing file: copied through
    {"prompt": "a blue circle", "response": "a given answer"},  # kept unless --regenerate
    {"video": "v00.mp4", "conversations": [{"from": "human", "value": "<image>\nwhat moves?"}]},
]
ANSWERED = [0, 1, 2, 3, 4, 8]  # the lines that need the target's answer
BAD, KEPT = [5, 6], 7


@pytest.fixture(scope="module")
def data(workdir):
    root = workdir / "respond"
    root.mkdir()
    rows = clip_rows(root, ["describe the video", "what moves first"], videos=2) + EXTRA
    path = root / "data.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _cfg(data, out, target, **kw):
    return RespondConfig(target=str(target), data=str(data), out=str(out), num_frames=FRAMES,
                         max_new_tokens=MAX_NEW, chunk=4, **kw)


def _lines(path):
    return path.read_text().splitlines()


@pytest.fixture(scope="module")
def target(workdir, target_dirs):
    """The tiny target, ending its turns at a token its greedy text-only answer writes early:
    the random tiny target never writes its own end-of-turn token, and the answers must show
    that vLLM keeps the end-of-turn token as HF generate does (both read generation_config.json)."""
    from vllm_sparrow.training.target_runner import HFTarget

    source, copy = target_dirs(KIND), workdir / "respond-target"
    shutil.copytree(source, copy)
    hf = HFTarget(str(source))
    answer = hf.answer(hf.encode(EXTRA[0]["prompt"], None, None), MAX_NEW)
    stop = next(t for n, t in enumerate(answer) if n >= 6 and t not in answer[:n])
    config = json.loads((copy / "generation_config.json").read_text())
    config["eos_token_id"] = [config["eos_token_id"], stop]
    (copy / "generation_config.json").write_text(json.dumps(config))
    return copy


@pytest.fixture(scope="module")
def llm(target):
    engine = make_llm(target)  # one engine for the file
    yield engine
    close_llm(engine)


@pytest.fixture(scope="module")
def runs(data, workdir, target, llm):
    """A plain run, its rerun with nothing left, a --regenerate run."""
    out, regen = workdir / "respond" / "responded.jsonl", workdir / "respond" / "regenerated.jsonl"
    first = respond(_cfg(data, out, target), llm=llm, progress=False)
    again = respond(_cfg(data, out, target), llm=_NoEngine(), progress=False)
    regenerated = respond(_cfg(data, regen, target, regenerate=True), llm=llm, progress=False)
    return dict(out=out, regen=regen, first=first, again=again, regenerated=regenerated)


class _NoEngine:
    def __getattr__(self, name):
        raise AssertionError(f"a rerun with nothing left used the engine ({name})")


@pytest.fixture(scope="module")
def reference(data, target):
    """HFTarget.answer (transformers, greedy: what capture writes without responses) per line."""
    from vllm_sparrow.training.data import load_media, read_samples
    from vllm_sparrow.training.target_runner import HFTarget

    hf = HFTarget(str(target))
    samples = {s.index: s for s in read_samples(data)}
    return {i: hf.answer(hf.encode(samples[i].prompt, samples[i].media_kind, load_media(samples[i], FRAMES)),
                         MAX_NEW) for i in ANSWERED}


def test_responses_are_the_targets_own_greedy_tokens(runs, reference, target):
    by_line = dict(enumerate(_lines(runs["out"])))
    for i in ANSWERED:
        row = json.loads(by_line[i])
        assert row["response_ids"] == reference[i], (i, row["response_ids"], reference[i])
        assert row["response"].strip()
    eos = json.loads((target / "generation_config.json").read_text())["eos_token_id"]
    ended = [reference[i] for i in ANSWERED if len(reference[i]) < MAX_NEW]
    assert ended and all(r[-1] in eos for r in ended)  # ended before the cut: with its end-of-turn token
    r = runs["first"]
    assert (r.responded, r.failed, r.kept, r.bad, r.resumed) == (len(ANSWERED), 0, 1, 2, 0), r
    assert "samples/s" in r.summary()


def test_bad_lines_and_existing_responses_are_copied_through(data, runs):
    source, out, regen = _lines(data), _lines(runs["out"]), _lines(runs["regen"])
    assert len(out) == len(regen) == len(source)  # one line per input line, same order
    for i in BAD:
        assert out[i] == regen[i] == source[i]
    assert out[KEPT] == source[KEPT]  # without --regenerate
    regenerated = json.loads(regen[KEPT])
    assert regenerated["response"] != "a given answer" and regenerated["response_ids"]
    assert [json.loads(regen[i]) for i in ANSWERED] == [json.loads(out[i]) for i in ANSWERED]
    r = runs["regenerated"]
    assert (r.responded, r.kept, r.bad) == (len(ANSWERED) + 1, 0, 2)


def test_a_rerun_with_nothing_left_starts_no_engine(runs):
    r = runs["again"]
    assert (r.responded, r.resumed) == (0, len(ANSWERED)), r
    ids = [row.get("index") for row in map(json.loads, work_file(runs["out"]).read_text().splitlines())]
    assert ids[0] is None and sorted(ids[1:]) == ANSWERED  # the settings row, then each answer once


def test_capture_stores_exactly_the_responded_tokens(runs, workdir, target):
    from vllm_sparrow.training.capture import CaptureConfig, capture
    from vllm_sparrow.training.shards import ShardReader

    cap = workdir / "respond" / "cap"
    report = capture(CaptureConfig(target=str(target), data=str(runs["out"]), out=str(cap),
                                   num_frames=FRAMES, max_new_tokens=MAX_NEW), progress=False)
    assert report.kept == len(ANSWERED) + 1 and report.skipped == {"bad json": 1, "missing file": 1}, report
    reader = ShardReader(cap)
    lines = _lines(runs["out"])
    for pos, (_, index) in enumerate(reader.where):
        sample = reader[pos]
        stored = sample["token_ids"][int(sample["prompt_len"]):].tolist()
        row = json.loads(lines[index])
        assert stored == row.get("response_ids", stored), index  # the kept line: its own response
    assert sorted(i for _, i in reader.where) == sorted(ANSWERED + [KEPT])


def _respond_cli(data, out, target, kill_at=None):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # one process: the kill takes the engine too
    env.pop("SPARROW_KILL_AT_WRITE", None)
    if kill_at is not None:
        env["SPARROW_KILL_AT_WRITE"] = kill_at
    return subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", "respond", "--target", str(target),
                           "--data", str(data), "--out", str(out), "--frames", str(FRAMES), "--max-new-tokens",
                           str(MAX_NEW), "--chunk", "2", "--engine-args", json.dumps(ENGINE_DEFAULTS)],
                          env=env, capture_output=True, text=True, timeout=600)


def test_runs_killed_mid_write_resume_to_the_uninterrupted_file(data, runs, tmp_path, target, llm):
    out = tmp_path / "killed.jsonl"
    work = work_file(out)
    killed = _respond_cli(data, out, target, kill_at="3:work")  # settings row, one answer, half of the next
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    torn = work.read_bytes()
    assert torn.count(b"\n") == 2 and not torn.endswith(b"\n") and not out.exists()
    rerun = respond(_cfg(data, out, target), llm=llm, progress=False)  # the module's engine: one start less
    assert (rerun.responded, rerun.resumed) == (len(ANSWERED) - 1, 1), rerun
    assert out.read_bytes() == runs["out"].read_bytes()
    ids = [json.loads(line).get("index") for line in work.read_text().splitlines()]
    assert ids[0] is None and sorted(ids[1:]) == ANSWERED  # each answer once: the torn one was cut


def test_a_run_killed_while_writing_the_output_leaves_none_and_its_rerun_writes_it(runs, data, tmp_path, target):
    """Every answer in the work file (as a run killed after its last chunk leaves it): the rerun
    starts no engine, and a kill half way through writing OUT leaves no OUT rather than half of one."""
    out = tmp_path / "late.jsonl"
    shutil.copy(work_file(runs["out"]), work_file(out))
    killed = _respond_cli(data, out, target, kill_at="1:late.jsonl")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not out.exists()
    done = _respond_cli(data, out, target)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"0 responded, 0 failed, {len(ANSWERED)} from an earlier run" in done.stdout, done.stdout
    assert out.read_bytes() == runs["out"].read_bytes()
