"""`sparrow caption --ray local --replicas 2` (a Ray cluster started on this machine, two engine
replicas of one CPU each, the Sparrow draft in each) survives kill -9 of its driver and of a
replica, and ends with the rows the one-process `sparrow caption` writes:

- the driver (the command) killed with SIGKILL half way through writing its third row: its whole
  local cluster (GCS, raylet, its agents, replicas) is gone seconds later (the watchdog), and the
  rows before stay whole;
- the rerun, the same command: one replica, holding an item (SPARROW_HOLD_REPLICA), is killed
  with SIGKILL from here; Ray restarts it and runs its item again, and the job finishes. Its rows
  are the one-process command's, row for row (captions, finish reasons, token counts, the error
  row of an undecodable clip), each id once and every line whole; the terminal shows the
  progress bar (items/s, ETA) and the report names the replicas that wrote rows; when the command
  returns, no process of its cluster is left;
- a rerun with nothing to do starts no cluster.

One chain of runs for all of it (a clean Ray run beside the killed ones cost ~60 lane-seconds and
showed nothing the rerun does not). A Parquet listing of the items (what a cluster job may read
from shared storage) gives what its JSONL twin gives.
"""

import json
import os
import re
import signal
import time

import pytest
from conftest import ENGINE_DEFAULTS
from support.ray_job_checks import rows, sparrow, two_replicas, wait_gone

from sparrow_world.synthetic_clip import write_synthetic_clip

KIND = "qwen2_5_vl"


@pytest.fixture(scope="module")
def job(workdir, target_dirs, trained_drafts):
    """The command on Ray, and the one-process command's rows for the same clips."""
    clips = workdir / "ray-caption-clips"
    for i in range(5):
        write_synthetic_clip(clips / f"clip{i}.mp4", 8, seed=60 + i)
    (clips / "broken.mp4").write_bytes(b"\x00" * 500)
    args = ["caption", "--target", str(target_dirs(KIND)), "--draft", str(trained_drafts(KIND)), "--inputs",
            str(clips), "--frames", "8", "--max-tokens", "12", "--chunk", "1",
            "--engine-args", json.dumps({**ENGINE_DEFAULTS, "max_model_len": 2048})]
    one = sparrow([*args, "--out", str(workdir / "ray-caption-one.jsonl")])
    assert one.wait(timeout=600) == 0, one.communicate()[1][-3000:]
    out = workdir / "ray-caption.jsonl"
    return [*args, "--out", str(out), *two_replicas()], out, rows(workdir / "ray-caption-one.jsonl")


@pytest.fixture(scope="module")
def killed_driver(job):
    cmd, _, _ = job
    driver = sparrow(cmd, env={"SPARROW_KILL_AT_WRITE": "3:ray-caption"})  # half of its third row
    stdout, stderr = driver.communicate(timeout=600)
    assert driver.returncode == -signal.SIGKILL, stdout[-2000:] + stderr[-3000:]
    return driver.pid, wait_gone(driver.pid, 10, driver.tree)


@pytest.fixture(scope="module")
def rerun_with_a_replica_killed(job, killed_driver, tmp_path_factory):
    cmd, _, _ = job
    hold = tmp_path_factory.mktemp("hold") / "held"
    start = time.monotonic()
    rerun = sparrow(cmd, env={"SPARROW_HOLD_REPLICA": str(hold)})
    deadline = start + 300
    while not (hold.exists() and hold.read_text().count("\n") == 2):
        assert rerun.poll() is None, rerun.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no replica took a batch within 300 s"
        time.sleep(0.1)
    pid, items = hold.read_text().splitlines()
    os.kill(int(pid), signal.SIGKILL)
    stdout, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stdout[-3000:] + stderr[-3000:]
    print(f"ray caption rerun: {time.monotonic() - start:.1f} s; {stdout.strip().splitlines()[-1]}")
    return int(pid), json.loads(items), stdout, wait_gone(rerun.pid, 0, rerun.tree)


def test_a_killed_driver_takes_its_cluster_and_keeps_its_whole_rows(job, killed_driver):
    _, out, _ = job
    _, left = killed_driver
    assert not left, f"processes of the killed command still run 10 s later: {left}"
    torn = out.read_bytes()
    assert torn.count(b"\n") == 2 and not torn.endswith(b"\n")  # two whole rows and a torn one


def test_the_rerun_finishes_after_a_replica_is_killed_with_every_item_once(job, rerun_with_a_replica_killed):
    _, out, _ = job
    killed, held, stdout, _ = rerun_with_a_replica_killed
    ids = [r["id"] for r in rows(out)]  # every line parses: the torn row was cut
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 6  # each item exactly once
    assert set(held) <= set(ids) and len(held) == 1  # the killed replica's item was run again
    assert re.search(r"(4 captioned, 0 errors|3 captioned, 1 errors), 2 already done", stdout), stdout
    assert f":{killed} " not in stdout.split("served by", 1)[1]  # it wrote nothing before it died


def test_no_process_of_the_cluster_outlives_the_command(rerun_with_a_replica_killed):
    *_, left = rerun_with_a_replica_killed
    assert not left, left


def test_rows_equal_the_one_process_commands_row_for_row(job, rerun_with_a_replica_killed):
    _, out, one = job
    on_ray = rows(out)
    assert {r["id"]: r for r in on_ray} == {r["id"]: r for r in one}
    assert sum("caption" in r for r in on_ray) == 5
    assert "cannot decode as video" in next(r for r in on_ray if r["id"] == "broken.mp4")["error"]


def test_the_terminal_shows_progress_and_the_replicas_that_wrote_rows(rerun_with_a_replica_killed):
    *_, stdout, _ = rerun_with_a_replica_killed
    served = re.search(r"served by (\d+) replicas? \(([^)]*)\)", stdout)
    assert served, stdout[-2000:]
    counts = [int(part.rsplit(" ", 1)[1]) for part in served.group(2).split(", ")]
    assert len(counts) == int(served.group(1)) and sum(counts) == 4 and min(counts) >= 1, served.group(0)
    assert re.search(r"caption: 100%.*\[\d\d:\d\d<\d\d:\d\d, +[\d.]+(video/s|s/video)\]", stdout), stdout[-2000:]
    assert "videos/s" in stdout


def test_a_rerun_with_nothing_to_do_starts_no_cluster(job, rerun_with_a_replica_killed):
    cmd, out, _ = job
    log = out.with_name(out.name + ".vllm.log")
    before, start = log.stat().st_size, time.monotonic()
    again = sparrow(cmd)
    stdout, stderr = again.communicate(timeout=120)
    assert again.returncode == 0 and "nothing to do: all 6 items" in stdout, stdout + stderr[-2000:]
    assert time.monotonic() - start < 30
    assert "Ray instance" not in log.read_text()[before:]  # ray.init() says "Started a local Ray instance"


def test_a_parquet_listing_gives_the_items_its_jsonl_twin_gives(tmp_path):
    """The listing a cluster job reads from shared storage may be Parquet: the same ids, paths
    (relative to the listing), prompts and refusal of duplicate ids as the JSONL."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from vllm_sparrow.batch_caption import DuplicateIds, list_items

    listing = [{"video": "a.mp4", "id": None, "prompt": None}, {"video": "b.mp4", "id": "bee", "prompt": "what?"},
               {"video": "/abs/c.mp4", "id": None, "prompt": None}]
    (tmp_path / "items.jsonl").write_text("\n".join(json.dumps({k: v for k, v in r.items() if v is not None})
                                                    for r in listing))
    pq.write_table(pa.Table.from_pylist(listing), tmp_path / "items.parquet")
    jsonl, parquet = list_items(tmp_path / "items.jsonl", "p"), list_items(tmp_path / "items.parquet", "p")
    assert parquet == jsonl and [it["id"] for it in parquet] == ["a.mp4", "bee", "/abs/c.mp4"]
    assert parquet[0]["video"] == str(tmp_path / "a.mp4") and parquet[1]["prompt"] == "what?"
    pq.write_table(pa.Table.from_pylist(listing + [{"video": "d.mp4", "id": "bee", "prompt": None}]),
                   tmp_path / "twice.parquet")
    with pytest.raises(DuplicateIds, match=r"'bee' on rows 2, 4"):
        list_items(tmp_path / "twice.parquet", "p")
