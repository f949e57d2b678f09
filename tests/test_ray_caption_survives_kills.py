"""`sparrow caption --ray local --replicas 2` survives kill -9 of its driver and of a replica:

- the driver (the command) killed with SIGKILL half way through writing its third row: its whole
  local cluster (GCS, raylet, its agents, replicas) is gone seconds later (the watchdog), and the rows before
  stay whole;
- the rerun, the same command: one replica, holding an item (SPARROW_HOLD_REPLICA), is killed
  with SIGKILL from here; Ray restarts it and runs its item again, and the job finishes. Every
  item is in the output exactly once, every line parses, and no process of the job outlives it.
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
    clips = workdir / "ray-kill-clips"
    for i in range(5):
        write_synthetic_clip(clips / f"clip{i}.mp4", 8, seed=80 + i)
    (clips / "broken.mp4").write_bytes(b"\x00" * 500)
    out = workdir / "ray-survives.jsonl"
    cmd = ["caption", "--target", str(target_dirs(KIND)), "--draft", str(trained_drafts(KIND)), "--inputs",
           str(clips), "--out", str(out), "--frames", "8", "--max-tokens", "12", "--chunk", "1",
           "--engine-args", json.dumps({**ENGINE_DEFAULTS, "max_model_len": 2048}), *two_replicas()]
    return cmd, out, sorted(p.name for p in clips.iterdir())


@pytest.fixture(scope="module")
def killed_driver(job):
    cmd, out, _ = job
    driver = sparrow(cmd, env={"SPARROW_KILL_AT_WRITE": "3:survives"})  # half of its third row
    stdout, stderr = driver.communicate(timeout=600)
    assert driver.returncode == -signal.SIGKILL, stdout[-2000:] + stderr[-3000:]
    return driver.pid, wait_gone(driver.pid, 10, driver.tree)


@pytest.fixture(scope="module")
def rerun_with_a_replica_killed(job, killed_driver, tmp_path_factory):
    cmd, out, _ = job
    hold = tmp_path_factory.mktemp("hold") / "held"
    rerun = sparrow(cmd, env={"SPARROW_HOLD_REPLICA": str(hold)})
    deadline = time.monotonic() + 300
    while not (hold.exists() and hold.read_text().count("\n") == 2):
        assert rerun.poll() is None, rerun.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no replica took a batch within 300 s"
        time.sleep(0.1)
    pid, items = hold.read_text().splitlines()
    os.kill(int(pid), signal.SIGKILL)
    stdout, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return int(pid), json.loads(items), stdout, wait_gone(rerun.pid, 0, rerun.tree)


def test_a_killed_driver_takes_its_cluster_and_keeps_its_whole_rows(job, killed_driver):
    _, out, _ = job
    _, left = killed_driver
    assert not left, f"processes of the killed command still run 10 s later: {left}"
    torn = out.read_bytes()
    assert torn.count(b"\n") == 2 and not torn.endswith(b"\n")  # two whole rows and a torn one


def test_the_rerun_finishes_after_a_replica_is_killed_with_every_item_once(job, rerun_with_a_replica_killed):
    _, out, names = job
    killed, held, stdout, left = rerun_with_a_replica_killed
    written = rows(out)  # every line parses: the torn row was cut
    ids = [r["id"] for r in written]
    assert sorted(ids) == names  # each item exactly once
    assert set(held) <= set(ids) and len(held) == 1  # the killed replica's item was run again
    assert re.search(r"(4 captioned, 0 errors|3 captioned, 1 errors), 2 already done", stdout), stdout
    assert f":{killed} " not in stdout.split("served by", 1)[1]  # it wrote nothing before it died
    assert not left, left
