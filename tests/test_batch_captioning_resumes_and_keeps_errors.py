"""Offline batch captioning (`sparrow caption`, vllm_sparrow.batch_caption): one JSONL row per
video, bad videos become error rows while the rest are captioned, a run stopped after a few
items (--limit) resumes, a run killed with SIGKILL in the middle of writing a row, and its rerun
killed again at another row, loses nothing and duplicates nothing when rerun, Ctrl-C ends with
the resume hint (vLLM's output in a log file), also while the engine is still starting (within
seconds, no engine process left), error rows run again only when asked, a rerun
with nothing to do starts no engine, ids are unique and come from the media path, and captions
with Sparrow equal the target's own greedy captions."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import ENGINE_DEFAULTS, close_llm, make_llm

from vllm_sparrow.batch_caption import CaptionJob, DuplicateIds, caption_batch, list_items
from sparrow_world.synthetic_clip import write_synthetic_clip

KIND = "qwen2_5_vl"


@pytest.fixture(scope="module")
def folder(workdir):
    root = workdir / "batch-videos"
    for i in range(4):
        write_synthetic_clip(root / f"clip{i}.mp4", 8, seed=20 + i)
    (root / "broken.mp4").write_bytes(b"\x00" * 500)
    return root


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _job(folder, out, target, **kw):
    return CaptionJob(inputs=str(folder), out=str(out), target=str(target), num_frames=8, max_tokens=12, chunk=2, **kw)


@pytest.fixture(scope="module")
def sparrow_run(folder, workdir, target_dirs, trained_drafts):
    target, out = target_dirs(KIND), workdir / "batch-sparrow.jsonl"
    llm = make_llm(target, disable_log_stats=False, speculative_config={
        "method": "sparrow", "model": str(trained_drafts(KIND)), "num_speculative_tokens": 3})
    reports = [caption_batch(_job(folder, out, target, limit=3), llm=llm, progress=False),  # a trial of 3 items
               caption_batch(_job(folder, out, target), llm=llm, progress=False),
               caption_batch(_job(folder, out, target), llm=llm, progress=False),  # nothing to do
               caption_batch(_job(folder, out, target, retry_errors=True), llm=llm, progress=False)]
    close_llm(llm)
    return out, reports


@pytest.fixture(scope="module")
def plain(target_dirs, sparrow_run):
    """A plain engine, opened after the sparrow engine is closed: in one process a speculative
    engine's shutdown tears down the distributed groups of any engine alive beside it."""
    llm = make_llm(target_dirs(KIND), max_model_len=1024)
    yield llm
    close_llm(llm)


def test_a_run_stopped_by_its_limit_resumes_and_bad_videos_become_error_rows(folder, sparrow_run):
    out, (first, rest, again, retried) = sparrow_run
    assert (first.done, first.errors) == (2, 1)  # broken.mp4 sorts first
    assert (rest.done, rest.errors, rest.skipped) == (2, 0, 3)
    assert (again.done, again.errors, again.skipped) == (0, 0, 5) and "nothing to do" in again.summary()
    assert (retried.done, retried.errors, retried.skipped) == (0, 1, 4)  # only the error row ran again
    assert "--retry-errors" in first.summary()  # the hint comes with every run that wrote error rows
    rows = _rows(out)
    ids = [r["id"] for r in rows]
    assert sorted(set(ids)) == sorted(p.name for p in folder.iterdir()) and ids.count("broken.mp4") == 2
    broken = next(r for r in rows if r["id"] == "broken.mp4")
    assert "cannot decode as video" in broken["error"] and "caption" not in broken
    captions = [r for r in rows if "caption" in r]
    assert {r["finish_reason"] for r in captions} <= {"stop", "length"}
    assert any(r["finish_reason"] == "length" and r["output_tokens"] == 12 for r in captions)  # cut at --max-tokens
    assert rest.mean_acceptance_length is not None and rest.mean_acceptance_length > 1.0  # drafts were accepted


def test_sparrow_captions_equal_the_targets_own(folder, sparrow_run, tmp_path, target_dirs, plain):
    caption_batch(_job(folder, tmp_path / "plain.jsonl", target_dirs(KIND)), llm=plain, progress=False)
    reference = {r["id"]: r.get("caption") for r in _rows(tmp_path / "plain.jsonl")}
    served = {r["id"]: r.get("caption") for r in _rows(sparrow_run[0])}
    assert sum(c is not None for c in reference.values()) == 4
    assert served == reference


def test_jsonl_input_with_a_bad_line_and_an_over_long_video(folder, tmp_path, target_dirs, plain):
    target = target_dirs(KIND)
    long_clip = write_synthetic_clip(tmp_path / "long.mp4", 256, seed=3)  # 2048 visual tokens > 1024
    src = tmp_path / "items.jsonl"
    src.write_text("\n".join([json.dumps({"video": str(folder / "clip0.mp4"), "id": "a"}),
                              "{not json",
                              json.dumps({"video": str(long_clip), "id": "long"}),
                              json.dumps({"video": str(folder / "clip1.mp4"), "id": "b", "prompt": "what moves?"})]))
    job = CaptionJob(inputs=str(src), out=str(tmp_path / "o.jsonl"), target=str(target), num_frames=256,
                     max_tokens=8, chunk=4)
    report = caption_batch(job, llm=plain, progress=False)
    rows = {r["id"]: r for r in _rows(tmp_path / "o.jsonl")}
    assert set(rows) == {"a", "line 2", "long", "b"}
    assert "caption" in rows["a"] and "caption" in rows["b"]
    assert "not a JSON object" in rows["line 2"]["error"]
    assert "longer than the maximum model length" in rows["long"]["error"], rows["long"]
    assert (report.done, report.errors) == (2, 2)


def _caption_cli(folder, out, target, kill_at=None):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # one process: the kill takes the engine too
    env.pop("SPARROW_KILL_AT_WRITE", None)
    if kill_at is not None:
        env["SPARROW_KILL_AT_WRITE"] = str(kill_at)
    engine = {**ENGINE_DEFAULTS, "max_model_len": 2048}
    return subprocess.run([sys.executable, "-m", "vllm_sparrow.cli", "caption", "--target", str(target),
                           "--inputs", str(folder), "--out", str(out), "--frames", "8", "--max-tokens", "12",
                           "--chunk", "2", "--engine-args", json.dumps(engine)],
                          env=env, capture_output=True, text=True, timeout=600)


def test_runs_killed_while_writing_rows_resume_without_loss_or_duplicates(folder, tmp_path, target_dirs):
    out = tmp_path / "killed.jsonl"
    killed = _caption_cli(folder, out, target_dirs(KIND), kill_at="3:killed")  # half of the third row written
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    torn = out.read_bytes()
    assert torn.count(b"\n") == 2 and not torn.endswith(b"\n")  # two whole rows and a torn one
    again = _caption_cli(folder, out, target_dirs(KIND), kill_at="2:killed")  # the rerun's second row
    assert again.returncode == -signal.SIGKILL, again.stderr[-2000:]
    assert out.read_bytes().count(b"\n") == 3  # the torn row cut, one new row whole, one torn
    done = _caption_cli(folder, out, target_dirs(KIND))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 captioned, 0 errors, 3 already done" in done.stdout
    rows = _rows(out)  # every line parses
    assert sorted(r["id"] for r in rows) == sorted(p.name for p in folder.iterdir())  # each once


def test_ctrl_c_ends_with_the_resume_hint_and_vllms_output_stays_in_its_log(tmp_path, target_dirs):
    """What a user sees: Ctrl-C (SIGINT to the command and its engine process, as a terminal
    sends it) ends with one line saying how to resume, no engine errors or traceback on the
    terminal (vLLM's output is in OUT.vllm.log); the rerun finishes the rest, and a rerun with
    nothing to do says so without starting an engine."""
    clips = tmp_path / "clips"
    CLIPS = 4  # one captioned before Ctrl-C (chunks of one), the rest by the rerun
    for i in range(CLIPS):
        write_synthetic_clip(clips / f"c{i}.mp4", 8, seed=40 + i)
    out = tmp_path / "out.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "SPARROW_KILL_AT_WRITE")}
    cmd = [sys.executable, "-m", "vllm_sparrow.cli", "caption", "--target", str(target_dirs(KIND)), "--inputs",
           str(clips), "--out", str(out), "--frames", "8", "--max-tokens", "64", "--chunk", "1",
           "--engine-args", json.dumps({**ENGINE_DEFAULTS, "max_model_len": 2048})]
    # faulthandler: a command that hangs after Ctrl-C is made to dump every thread's stack (below)
    proc = subprocess.Popen(cmd, env={**env, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    while not (out.exists() and out.read_bytes().count(b"\n") >= 1) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # the command's process group: it and vLLM's engine process
    stdout, stderr = _communicate_or_show_the_hang(proc, tmp_path / "out.jsonl.vllm.log", timeout=180)
    terminal = stdout + stderr
    assert proc.returncode == 130, terminal[-3000:]
    assert "interrupted:" in stdout and "rerun the same command to resume" in stdout, terminal[-3000:]
    for noise in ("Traceback", "ERROR", "EngineDeadError"):
        assert noise not in terminal, terminal[-3000:]
    assert (tmp_path / "out.jsonl.vllm.log").stat().st_size > 0
    written = out.read_bytes().count(b"\n")
    assert 1 <= written < CLIPS
    # the rerun in one process (the suite's setting): what it must show is the resume, and vLLM's
    # engine core and worker in processes of their own cost two imports of vLLM and a 5 s shutdown
    again = subprocess.run(cmd, env={**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"{CLIPS - written} captioned, 0 errors, {written} already done" in again.stdout, again.stdout
    t0 = time.time()
    idle = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert idle.returncode == 0 and f"nothing to do: all {CLIPS} items" in idle.stdout, idle.stdout + idle.stderr
    assert time.time() - t0 < 30  # no engine was started


def _communicate_or_show_the_hang(proc: subprocess.Popen, log, timeout: float) -> tuple[str, str]:
    """proc's output once it exits; if it has not exited within `timeout` seconds, a failure that
    shows where it hangs: the processes left in its session and, from SIGABRT to the command
    (PYTHONFAULTHANDLER=1), every thread's stack, which faulthandler writes to fd 2 (the log
    while vLLM's output is redirected there, else the command's stderr). One such hang was seen
    in a full `make test` (2026-12-06) and none in runs of this file alone."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    left = [f"{p.pid} {p.status()} {' '.join(p.cmdline())[:160]}" for p in _session(proc.pid)]
    os.kill(proc.pid, signal.SIGABRT)
    try:
        stdout, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    for p in _session(proc.pid):
        p.kill()
    log_tail = log.read_text(errors="replace")[-6000:] if log.exists() else "(no log)"
    pytest.fail(f"the command did not exit within {timeout:.0f} s of Ctrl-C\nprocesses left: {left}\n"
                f"stdout: {stdout[-2000:]}\nstderr: {stderr[-6000:]}\nlog tail: {log_tail}")


def _session(sid: int) -> list[psutil.Process]:
    """The running processes of a session (start_new_session: the command and all it started;
    vLLM's processes keep their parent's session, orphaned or not); zombies hold nothing."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return found


def test_ctrl_c_while_the_engine_starts_ends_at_once_and_leaves_no_engine_process(tmp_path, target_dirs):
    """Ctrl-C while vLLM's engine core process is still starting: vLLM's front end waits for it
    in a start-up handshake that drops a KeyboardInterrupt, and then waited up to 10 minutes for
    an engine core the same Ctrl-C had killed. Now (lifetime.interruptible_start) the command
    ends within seconds with the same resume line, and no process it started outlives it."""
    clips = tmp_path / "clips"
    write_synthetic_clip(clips / "c0.mp4", 8, seed=40)
    out, log = tmp_path / "out.jsonl", tmp_path / "out.jsonl.vllm.log"
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "SPARROW_KILL_AT_WRITE", "SPARROW_PARENT_PID")}
    args = ["caption", "--target", str(target_dirs(KIND)), "--inputs", str(clips), "--out", str(out), "--frames", "8",
            "--max-tokens", "8", "--engine-args", json.dumps({**ENGINE_DEFAULTS, "max_model_len": 2048})]
    # As a terminal starts it: Ctrl-C at Python's default. A suite run as a shell's background job
    # inherits SIGINT ignored (POSIX, without job control), and Python keeps it ignored: the command
    # would then rightly ignore Ctrl-C, as a nohup'd one does (what made this test hang in such runs).
    cmd = [sys.executable, "-c", "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
           f"sys.argv = ['sparrow'] + {args!r}; runpy.run_module('vllm_sparrow.cli', run_name='__main__')"]
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT dumps every thread's stack (a hang is then explained)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        text = ""
        while "(EngineCore" not in text:  # the engine core process logs: it runs, and is not ready yet
            assert proc.poll() is None, proc.communicate()[1][-3000:] + text[-3000:]
            assert time.monotonic() < deadline, f"no engine core within 300 s: {text[-3000:]}"
            time.sleep(0.05)
            text = log.read_text(errors="replace") if log.exists() else ""
        assert "init engine" not in text  # vLLM's line once the engine core is ready: still starting
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the command and vLLM's processes
        t0 = time.monotonic()
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # where it hangs: faulthandler's dump goes to vLLM's log (fd 2)
            os.kill(proc.pid, signal.SIGABRT)
            time.sleep(5)
            pytest.fail("sparrow caption still runs 60 s after Ctrl-C during engine start-up; its stacks and "
                        f"log:\n{log.read_text(errors='replace')[-6000:]}")
        ended = time.monotonic() - t0
        terminal = stdout + stderr
        assert proc.returncode == 130, terminal[-3000:]
        assert "interrupted: 0 rows written" in stdout and "rerun the same command to resume" in stdout, terminal
        assert "Traceback" not in terminal, terminal[-3000:]
        assert ended < 30, f"ended {ended:.1f} s after Ctrl-C"
        gone_by = time.monotonic() + 15
        while (left := _session(proc.pid)) and time.monotonic() < gone_by:
            time.sleep(0.2)
        assert not left, [(p.pid, p.cmdline()) for p in left]
        print(f"ended {ended:.1f} s after Ctrl-C during engine start-up; no process left")
    finally:
        for p in _session(proc.pid):  # so that a failure leaves nothing behind
            p.kill()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_ids_come_from_the_media_path_and_duplicates_are_refused(tmp_path):
    src = tmp_path / "items.jsonl"
    src.write_text("\n".join([json.dumps({"video": "a.mp4"}), json.dumps({"video": "b.mp4", "prompt": "x"}),
                              json.dumps({"video": "c.mp4", "id": "a.mp4"})]))
    with pytest.raises(DuplicateIds, match=r"'a.mp4' on lines 1, 3"):
        list_items(src, "p")
    src.write_text("\n".join([json.dumps({"video": "b.mp4"}), json.dumps({"video": "a.mp4"})]))
    assert [it["id"] for it in list_items(src, "p")] == ["b.mp4", "a.mp4"]  # reordering keeps ids
