"""Each bad Sparrow speculative config fails at start-up with a message that says what to do."""

import json
import shutil

import pytest
from conftest import make_llm

from vllm_sparrow.checkpoint import init_draft


def _spec(draft, **kw):
    return {"method": "sparrow", "model": str(draft), "num_speculative_tokens": 2, **kw}


def _edit_config(draft_dir, edit):
    path = draft_dir / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def qwen(target_dirs):
    return target_dirs("qwen2_5_vl")


def test_missing_draft_directory(qwen, tmp_path):
    with pytest.raises(Exception, match="does not exist.*sparrow init-draft|does not exist"):
        make_llm(qwen, speculative_config=_spec(tmp_path / "nowhere"))


def test_directory_without_sparrow_config(qwen, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="no config.json"):
        make_llm(qwen, speculative_config=_spec(tmp_path / "empty"))


def test_draft_with_other_hidden_size(qwen, tmp_path):
    draft = init_draft(qwen, tmp_path / "d")

    def edit(cfg):
        cfg["transformer_layer_config"]["hidden_size"] = 64
        cfg["target_hidden_size"] = 64

    _edit_config(draft, edit)
    with pytest.raises(Exception, match="hidden states of size 64.*hidden size 128"):
        make_llm(qwen, speculative_config=_spec(draft))


def test_draft_with_other_vocabulary(qwen, tmp_path):
    draft = init_draft(qwen, tmp_path / "d")
    _edit_config(draft, lambda cfg: cfg["transformer_layer_config"].update(vocab_size=999))
    with pytest.raises(Exception, match="vocabulary size 999.*must share a vocabulary"):
        make_llm(qwen, speculative_config=_spec(draft))


def test_unsupported_target_architecture(target_dirs, tmp_path):
    llama = target_dirs("llama")
    draft = init_draft(llama, tmp_path / "d")
    other = tmp_path / "mistral"
    shutil.copytree(llama, other)
    _edit_config(other, lambda cfg: cfg.update(architectures=["MistralForCausalLM"], model_type="mistral"))
    with pytest.raises(Exception, match="does not support target architecture.*MistralForCausalLM"):
        make_llm(other, speculative_config=_spec(draft))


def test_unknown_method_is_still_rejected(qwen, tmp_path):
    with pytest.raises(Exception, match="method"):
        make_llm(qwen, speculative_config={"method": "sparrowz", "model": str(tmp_path), "num_speculative_tokens": 2})


def test_draft_cache_that_cannot_fit_is_refused_at_startup(qwen, tmp_path):
    # a window of 100M text tokens: 16 slots of it need far more memory than this machine has
    draft = init_draft(qwen, tmp_path / "d")
    _edit_config(draft, lambda cfg: cfg.update(window_tokens=100_000_000))
    with pytest.raises(Exception, match=r"draft cache needs .* GiB .*Lower max_num_seqs, or lower window_tokens"):
        make_llm(qwen, speculative_config=_spec(draft))


def test_draft_made_for_other_target_weights_is_refused_unless_allowed(qwen, tmp_path, monkeypatch):
    """Same architecture, sizes and vocabulary, other weights (a fine-tune, a retrained target):
    every draft would be rejected, so start-up refuses it, naming the override."""
    from safetensors.torch import load_file, save_file

    retrained = tmp_path / "retrained-target"
    shutil.copytree(qwen, retrained)
    weights = load_file(retrained / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1.0
    save_file(weights, retrained / "model.safetensors", metadata={"format": "pt"})
    draft = init_draft(qwen, tmp_path / "d")  # records the original target's fingerprint
    with pytest.raises(Exception, match="made for another verifier.*fingerprint.*SPARROW_ALLOW_OTHER_VERIFIER=1"):
        make_llm(retrained, speculative_config=_spec(draft))
    monkeypatch.setenv("SPARROW_ALLOW_OTHER_VERIFIER", "1")
    from conftest import close_llm

    close_llm(make_llm(retrained, speculative_config=_spec(draft)))  # the user's explicit choice


def test_draft_made_for_another_architecture_is_refused(qwen, target_dirs, tmp_path):
    draft = init_draft(qwen, tmp_path / "d")
    _edit_config(draft, lambda cfg: cfg["speculators_config"]["verifier"].update(
        architectures=["Qwen2VLForConditionalGeneration"], weights_fingerprint=None))
    with pytest.raises(Exception, match="architecture Qwen2VLForConditionalGeneration.*this target: Qwen2_5_VL"):
        make_llm(qwen, speculative_config=_spec(draft))


def test_pipeline_parallelism_is_refused_with_a_message(qwen, tmp_path):
    draft = init_draft(qwen, tmp_path / "d")
    with pytest.raises(Exception, match="does not support pipeline parallelism.*tensor-parallel-size"):
        make_llm(qwen, pipeline_parallel_size=2, speculative_config=_spec(draft))


@pytest.mark.parametrize("method", ["eagle", "eagle3", None])
def test_a_sparrow_draft_under_another_method_says_use_sparrow(qwen, tmp_path, method):
    """vLLM would load the draft as its own model ~40 s in and die on a bare TypeError."""
    draft = init_draft(qwen, tmp_path / "d")
    spec = {"model": str(draft), "num_speculative_tokens": 2, **({"method": method} if method else {})}
    with pytest.raises(Exception, match=r"is a Sparrow draft .* cannot run\. Use --speculative-config "
                                        r"'\{\"method\": \"sparrow\""):
        make_llm(qwen, speculative_config=spec)


@pytest.mark.parametrize("spec", [{"num_speculative_tokens": 17},
                                  {"num_speculative_tokens_per_batch_size": [(1, 4, 3), (5, 16, 17)]}])
def test_a_depth_past_the_limit_is_refused_naming_it_and_the_recommended_one(qwen, tmp_path, spec):
    draft = init_draft(qwen, tmp_path / "d")
    with pytest.raises(Exception, match=r"drafts 1 to 16 tokens per step, 17 was asked\. Leave "
                                        r"num_speculative_tokens out to use the draft's recommended depth \(3"):
        make_llm(qwen, speculative_config={"method": "sparrow", "model": str(draft), **spec})


def test_model_runner_v2_forced_by_its_variable_is_refused_naming_it(qwen, tmp_path, monkeypatch):
    """VLLM_USE_V2_MODEL_RUNNER=1 bypasses the fallback that keeps sparrow on the V1 runner; MRV2
    would build vLLM's own EAGLE speculator for the Sparrow draft (docs/model-runner-v2.md)."""
    from vllm import envs

    draft = init_draft(qwen, tmp_path / "d")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    envs.disable_envs_cache()  # an engine started earlier in this process may have cached the variable
    with pytest.raises(Exception, match=r"VLLM_USE_V2_MODEL_RUNNER=1 forces Model Runner V2: unset "
                                        r"VLLM_USE_V2_MODEL_RUNNER \(or set it to 0\)"):
        make_llm(qwen, speculative_config=_spec(draft))
