"""`sparrow caption --ray local --replicas 2` (a Ray cluster started on this machine, two engine
replicas of one CPU each, the Sparrow draft in each) writes the rows the one-process
`sparrow caption` writes, row for row (captions, finish reasons, token counts, the error row of
an undecodable clip), each id once; both replicas served items; the terminal shows the progress
bar (items/s, ETA) and the report names the replicas; when the command returns, no process of its
cluster is left. A rerun with nothing to do starts no cluster. A Parquet listing of the items
(what a cluster job may read from shared storage) gives what its JSONL twin gives."""

import json
import re
import time

import pytest
from conftest import ENGINE_DEFAULTS
from support.ray_job_checks import rows, sparrow, two_replicas, wait_gone

from sparrow_world.synthetic_clip import write_synthetic_clip

KIND = "qwen2_5_vl"


@pytest.fixture(scope="module")
def runs(workdir, target_dirs, trained_drafts):
    clips = workdir / "ray-caption-clips"
    for i in range(5):
        write_synthetic_clip(clips / f"clip{i}.mp4", 8, seed=60 + i)
    (clips / "broken.mp4").write_bytes(b"\x00" * 500)
    args = ["caption", "--target", str(target_dirs(KIND)), "--draft", str(trained_drafts(KIND)), "--inputs",
            str(clips), "--frames", "8", "--max-tokens", "12", "--chunk", "1",
            "--engine-args", json.dumps({**ENGINE_DEFAULTS, "max_model_len": 2048})]
    one = sparrow([*args, "--out", str(workdir / "ray-caption-one.jsonl")])
    assert one.wait(timeout=600) == 0, one.communicate()[1][-3000:]
    cmd = [*args, "--out", str(workdir / "ray-caption-two.jsonl"), *two_replicas()]
    start = time.monotonic()
    two = sparrow(cmd)
    stdout, stderr = two.communicate(timeout=600)
    seconds = time.monotonic() - start
    assert two.returncode == 0, stdout[-3000:] + stderr[-3000:]
    left = wait_gone(two.pid, 0, two.tree)
    print(f"ray caption: {seconds:.1f} s; {stdout.strip().splitlines()[-1]}")
    return (rows(workdir / "ray-caption-one.jsonl"), rows(workdir / "ray-caption-two.jsonl"), stdout, left,
            cmd, clips)


def test_rows_equal_the_one_process_commands_row_for_row(runs):
    one, two, *_ = runs
    assert len(two) == len({r["id"] for r in two}) == 6  # each id once
    assert {r["id"]: r for r in two} == {r["id"]: r for r in one}
    assert sum("caption" in r for r in two) == 5
    assert "cannot decode as video" in next(r for r in two if r["id"] == "broken.mp4")["error"]


def test_both_replicas_served_and_the_terminal_shows_progress(runs):
    _, _, stdout, *_ = runs
    served = re.search(r"served by (\d+) replicas \(([^)]*)\)", stdout)
    assert served and served.group(1) == "2", stdout[-2000:]
    counts = [int(part.rsplit(" ", 1)[1]) for part in served.group(2).split(", ")]
    assert sum(counts) == 6 and min(counts) >= 1
    assert re.search(r"caption: 100%.*\[\d\d:\d\d<\d\d:\d\d, +[\d.]+(video/s|s/video)\]", stdout), stdout[-2000:]
    assert "5 captioned, 1 errors, 0 already done" in stdout and "videos/s" in stdout


def test_no_process_of_the_cluster_outlives_the_command(runs):
    *_, left, _, _ = runs
    assert not left, left


def test_a_rerun_with_nothing_to_do_starts_no_cluster(runs, workdir):
    *_, cmd, _ = runs
    log = workdir / "ray-caption-two.jsonl.vllm.log"
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
