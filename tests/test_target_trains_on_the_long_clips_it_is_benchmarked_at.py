"""The hard target's long stage (issue 47): after the main stage and the extension, batch-1 steps
on real clips as long as the benchmark's (up to 1,536 s, 24,576 visual tokens). It trains on the
clips it is given with its vision tower frozen; its loss takes the LM head on caption positions
only and equals the full-logits loss; a run killed at any write resumes to the uninterrupted
run's weights; a stage-1 checkpoint older than the stage's knobs is continued, not retrained;
a restart after a recipe change begins from the weights the stage first began from, even when
its output overwrote them; and `sparrow demo build --stages target --target-from DIR` runs it
alone, recording its start. Tiny models and clips of seconds: the real sizes are the build's."""

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from sparrow_world.demo import train_target as tt
from sparrow_world.demo.target_data import WorldBatches


def _cfg(**long) -> tt.TargetTrainConfig:
    knobs = dict(steps=6, durations=(6, 10), replay_share=0.0, eval_seconds=(6,), eval_scenes=1, eval_every=2,
                 save_every=2)
    return tt.TargetTrainConfig(world="hard", hidden_size=32, num_layers=2, batch_size=2, eval_scenes=1, threads=1,
                                long=tt.LongStage(**{**knobs, **long}))


@pytest.fixture(autouse=True)
def _threads_and_captions(monkeypatch):
    """train_target sets torch's threads for the whole process: give the other tests theirs back;
    greedy eval captions of 8 tokens (an untrained model never ends its own)."""
    threads = torch.get_num_threads()
    monkeypatch.setattr(tt, "GREEDY_TOKENS", 8)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """An untrained target folder: the weights a long stage starts from (`start_from`)."""
    return tt.build_untrained(tmp_path_factory.mktemp("long") / "start", _cfg())


def _weights(state_dir) -> dict:
    return torch.load(state_dir / "long_state.pt", weights_only=False)["model"]


def _eval_steps(state_dir) -> list[int]:
    return [json.loads(x)["step"] for x in (state_dir / "long_log.jsonl").read_text().splitlines()]


def test_the_long_stage_trains_on_the_clips_it_is_given_with_the_tower_frozen(start, tmp_path, monkeypatch):
    drawn, real_sample = [], WorldBatches.sample

    def sample(self, seed, world):
        if seed < tt.EVAL_SEED0:  # a training draw (held-out scenes are EVAL_SEED0 and up)
            drawn.append(world.duration_s)
        return real_sample(self, seed, world)

    monkeypatch.setattr(WorldBatches, "sample", sample)
    cfg, out, state = _cfg(), tmp_path / "out", tmp_path / "state"
    tt.train_target(out, cfg, resume=True, state_dir=state, start_from=start)
    assert len(drawn) == cfg.long.steps and set(drawn) <= {6, 10}, drawn  # batch 1, the stage's lengths
    before = tt._long_start(state, start)[0]
    after = _weights(state)
    tower = [k for k in after if ".visual." in k]
    assert tower and all(torch.equal(before[k], after[k]) for k in tower)
    assert any(not torch.equal(before[k], after[k]) for k in after if k not in tower)
    log = [json.loads(x) for x in (state / "long_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 2, 4, 6]
    assert set(log[-1]["long"]["6s"]["facts"]) >= {"caption_fact_accuracy", "object_recall"}  # scored by meaning
    from safetensors.torch import load_file

    served = load_file(out / "model.safetensors")
    assert torch.equal(served["lm_head.weight"], after["lm_head.weight"])
    assert (out / "tokenizer.json").exists()  # a servable folder, not only weights


def test_the_loss_takes_the_lm_head_on_caption_positions_only_and_equals_the_full_logits_loss(start):
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    from sparrow_world.world import WorldConfig

    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(start, dtype=torch.float32)
    data = tt._world_batches(AutoTokenizer.from_pretrained(start), _cfg())
    samples = [data.sample(s, WorldConfig(duration_s=4)) for s in (1, 2)]  # captions of other lengths
    assert len(samples[0].caption_ids) != len(samples[1].caption_ids)
    kw, labels, P = data.batch(samples)
    B, L = labels.shape

    logits = tt.caption_logits(model, kw, P)
    assert logits.shape == (B, L - P, model.config.text_config.vocab_size)
    loss = tt.caption_loss(logits, labels, P)
    loss.backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    full = model(**kw).logits  # [B, L, V]: position j predicts token j + 1
    reference = torch.nn.functional.cross_entropy(full[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                                  ignore_index=-100)
    reference.backward()
    assert torch.allclose(loss, reference, rtol=1e-6, atol=1e-6)
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(ours[n], p.grad, rtol=1e-4, atol=1e-7), n


TRAIN = ("import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[2]); "
         "from test_target_trains_on_the_long_clips_it_is_benchmarked_at import _cfg; "
         "from sparrow_world.demo import train_target as tt; tt.GREEDY_TOKENS = 8; a = json.loads(sys.argv[1]); "
         "tt.train_target(Path(a['out']), _cfg(), resume=True, state_dir=Path(a['state']), start_from=Path(a['start']))")


def _child_run(out, state, start, kill_at: str | None = None) -> subprocess.CompletedProcess:
    """A run of `_cfg()` in a fresh child process, as `sparrow demo build` runs it, killed half way
    through its write `kill_at` (durable.py's hook) when one is named. Every run compared runs in a
    child: once an in-process vLLM engine has run in the test process, vLLM's CPU worker has replaced
    torch.set_num_threads with a no-op, so the stage's one thread is two there and a step's last
    bits differ (a CI run failed so); the build's own process never hosts an engine."""
    args = json.dumps({"out": str(out), "state": str(state), "start": str(start)})
    env = {k: v for k, v in os.environ.items() if k != "SPARROW_KILL_AT_WRITE"}
    if kill_at:
        env["SPARROW_KILL_AT_WRITE"] = kill_at
    return subprocess.run([sys.executable, "-c", TRAIN, args, os.path.dirname(__file__)],
                          env=env, capture_output=True, text=True, timeout=300)


def test_kills_at_each_kind_of_write_resume_to_the_uninterrupted_weights(start, tmp_path):
    """Killed half way through the start snapshot (the rerun starts afresh), then through the
    checkpoint of step 4 (the rerun resumes at step 2), then through the log row of step 4's
    eval (a torn line; the rerun resumes at 4 and logs it once), then run to the end."""
    straight = tmp_path / "straight"
    done = _child_run(tmp_path / "out-straight", straight, start)
    assert done.returncode == 0, done.stderr[-2000:]
    run, out = tmp_path / "killed", tmp_path / "out-killed"
    first = _child_run(out, run, start, "1:long_start")
    assert first.returncode == -signal.SIGKILL and not (run / "long_state.pt").exists(), first.stderr[-2000:]
    second = _child_run(out, run, start, "2:long_state")
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    assert torch.load(run / "long_state.pt", weights_only=False)["state"]["step"] == 2
    third = _child_run(out, run, start, "3:long_log")  # its log writes: step 2's row dropped, redone, step 4's
    assert third.returncode == -signal.SIGKILL, third.stderr[-2000:]
    assert torch.load(run / "long_state.pt", weights_only=False)["state"]["step"] == 4
    last = _child_run(out, run, start)
    assert last.returncode == 0, last.stderr[-2000:]
    assert _eval_steps(run) == [0, 2, 4, 6]
    ours, reference = _weights(run), _weights(straight)
    assert ours.keys() == reference.keys()
    for key in ours:
        assert torch.equal(ours[key], reference[key]), key
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "out-straight" / "model.safetensors").read_bytes()


def _finished_stage1(out, state, cfg, step: int = 7) -> None:
    """A finished stage-1 checkpoint as one saved before the long stage existed: no "long" knobs."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from vllm_sparrow.durable import atomic_torch_save

    tt.build_untrained(out, cfg)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32)
    heads = tt.VisionHeads(model.config.vision_config.out_hidden_size)
    state.mkdir(parents=True)
    tt._save(model, heads, tt._optimizer(model, heads, cfg), dict(step=step, elapsed=cfg.total_seconds, rng=None),
             cfg, state)
    saved = torch.load(state / "train_state.pt", weights_only=False)
    del saved["config"]["long"]
    atomic_torch_save(state / "train_state.pt", saved)


def _entry_weights(monkeypatch) -> list[dict]:
    """The weights each long stage begins its steps from, as `_long_loop` receives them."""
    seen, loop = [], tt._long_loop

    def spy(model, *args):
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return loop(model, *args)

    monkeypatch.setattr(tt, "_long_loop", spy)
    return seen


def test_a_stage1_checkpoint_older_than_the_long_stage_is_continued_not_retrained(tmp_path, monkeypatch, capsys):
    cfg, out, state = _cfg(steps=2), tmp_path / "target", tmp_path / "state"
    _finished_stage1(out, state, cfg)
    checkpoint = (state / "train_state.pt").read_bytes()
    entries = _entry_weights(monkeypatch)
    tt.train_target(out, cfg, resume=True, state_dir=state, start_from=tmp_path / "unused")
    said = capsys.readouterr().out
    assert "another recipe" not in said and "starting fresh" not in said and "unused" not in said, said
    assert (state / "train_state.pt").read_bytes() == checkpoint  # stage 1 untouched
    start = tt.long_stage_record(state)["start"]
    assert start["source"] == "stage-1 checkpoint" and start["stage1_step"] == 7
    stage1 = torch.load(state / "train_state.pt", weights_only=False)["model"]
    assert all(torch.equal(entries[0][k], stage1[k]) for k in stage1)


def test_a_changed_long_recipe_restarts_from_the_first_start_though_the_output_overwrote_it(start, tmp_path,
                                                                                            monkeypatch, capsys):
    """The shipped case: the stage starts from models/world-hard/target and writes its weights
    there. Rerun with another learning rate, it must start from the snapshot of the weights it
    first began from, not from its own output."""
    import shutil

    shipped, state = tmp_path / "shipped", tmp_path / "state"
    shutil.copytree(start, shipped)
    entries = _entry_weights(monkeypatch)
    cfg = _cfg(steps=2)
    tt.train_target(shipped, cfg, resume=True, state_dir=state, start_from=shipped)
    first_output = (shipped / "model.safetensors").read_bytes()
    assert first_output != (start / "model.safetensors").read_bytes()
    capsys.readouterr()
    tt.train_target(shipped, replace(cfg, long=replace(cfg.long, lr=1e-4)), resume=True, state_dir=state,
                    start_from=shipped)
    assert "another recipe (long.lr)" in capsys.readouterr().out
    assert len(entries) == 2 and all(torch.equal(entries[0][k], entries[1][k]) for k in entries[0])
    assert tt.long_stage_record(state)["start"]["source"] == str(shipped)
    tt.train_target(shipped, replace(cfg, threads=2, long=replace(cfg.long, lr=1e-4, eval_every=1)), resume=True,
                    state_dir=state, start_from=shipped)  # knobs that change no weights: finished, kept
    assert len(entries) == 2 and "another recipe" not in capsys.readouterr().out


def test_the_hard_build_runs_the_long_stage_at_bench_lengths_and_the_easy_build_does_not():
    from sparrow_world.demo.build import DemoBuildConfig, hard_world

    long = hard_world().target.long
    assert long.steps > 0 and long.max_stretch * max(long.durations) * 16 >= 24_960  # the longest bench clip
    assert max(long.durations) == 1536 and {1088, 1536} <= set(long.eval_seconds)
    assert DemoBuildConfig().target.long.steps == 0


def test_build_stages_target_stops_after_the_target_and_records_where_the_long_stage_began(tmp_path, monkeypatch):
    from sparrow_world.demo import build as build_mod
    from vllm_sparrow.cli import build_parser

    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE"):  # `sparrow demo` sets defaults
        monkeypatch.delenv(name, raising=False)  # restored after the test
    models, work, shipped = tmp_path / "models", tmp_path / "work", tmp_path / "shipped"
    (shipped).mkdir()
    (shipped / "model.safetensors").write_bytes(b"weights")
    models.mkdir()
    (models / "build.json").write_text(json.dumps({"seconds": {"target (training wall clock)": 3901.2,
                                                               "sparrow draft": 112.0},
                                                   "sparrow_heldout_replay": {"mean_acceptance_length": 6.2}}))
    asked = {}

    def train_target(out, cfg, resume, state_dir, start_from):
        asked.update(out=out, threads=cfg.threads, steps=cfg.long.steps, start_from=start_from)
        return out

    monkeypatch.setattr(build_mod, "train_target", train_target)
    monkeypatch.setattr(build_mod, "long_stage_record", lambda state_dir: {"start": {"source": str(shipped)},
                                                                           "seconds": 9000.0})
    monkeypatch.setattr(build_mod, "write_clips", lambda *a, **k: pytest.fail("the build went past the target"))
    args = build_parser().parse_args(["demo", "build", "--stages", "target", "--target-from", str(shipped),
                                      "--threads", "1", "--long-steps", "12", "--models", str(models),
                                      "--workdir", str(work)])
    assert args.fn(args) == 0
    assert asked == dict(out=models / "target", threads=1, steps=12, start_from=str(shipped))
    record = json.loads((models / "build.json").read_text())
    assert record["target_long_stage"]["start"]["source"] == str(shipped)
    assert record["seconds"] == {"target (training wall clock)": 3901.2, "sparrow draft": 112.0,
                                 "target long stage": 9000.0}
    assert record["config"]["target"]["long"]["steps"] == 12 and record["config"]["stages"] == "target"
    assert "made with the target before it" in record["drafts_note"]
