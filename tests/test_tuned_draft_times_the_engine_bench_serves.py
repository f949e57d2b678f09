"""benchmarks/tuned_draft.py tunes a copy of a draft for `sparrow bench` to serve beside fixed
depths. Tune's costs belong to the engine it opens, so it must open the one the bench serves in
(its dtype and graph setting): a schedule tuned on vLLM's defaults (bfloat16, compiled) chose
deeper chains at batch 16 than the float32 eager bench could afford."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import tuned_draft  # noqa: E402

from sparrow_world.bench.config import BenchConfig  # noqa: E402
from sparrow_world.bench.engines import enforce_eager  # noqa: E402


class _Result:
    def summary(self) -> str:
        return "tuned"


def test_tune_opens_the_engine_the_bench_serves(tmp_path, monkeypatch):
    import vllm_sparrow.training.tune as tune_module

    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    seen = {}

    def fake_tune(cfg):
        seen["cfg"] = cfg
        return _Result()

    monkeypatch.setattr(tune_module, "tune", fake_tune)
    out = tmp_path / "out"
    assert tuned_draft.main(["--draft", str(draft), "--capture", "cap", "--data", "d.jsonl", "--out", str(out)]) == 0
    cfg, bench = seen["cfg"], BenchConfig()
    args = cfg.engine_args
    assert (args["dtype"], args["enforce_eager"]) == (bench.dtype, enforce_eager(bench))
    # tune times the capture's whole 6,144-token videos, 16 at once: the budget holds them (vLLM's
    # default, 4,096 tokens, refused one such video)
    assert args["max_model_len"] > 6144 + bench.max_tokens and args["max_num_batched_tokens"] >= 16 * 6144
    assert cfg.draft == str(out / "draft") and (out / "draft" / "config.json").is_file()  # the copy, not the draft
    assert cfg.write
