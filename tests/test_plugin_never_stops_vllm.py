"""Installing vllm-sparrow never stops vLLM from starting: on another vLLM version the plugin logs
one line and registers nothing (plain vLLM serves; `sparrow` is refused as an unknown method), and
so it does on a vLLM that lacks an internal Sparrow reads; a patch that fails to apply is undone
with the rest; each general vLLM fix can be turned off by name (its reads are then not checked).
Each case runs in a fresh process (the plugin patches once per process)."""

import os
import subprocess
import sys
import textwrap

from conftest import gpu_share


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=600)


def test_on_another_vllm_version_plain_vllm_runs_and_sparrow_is_refused(target_dirs):
    done = _run(f"""
        import vllm
        vllm.__version__ = "0.99.0"
        from vllm import LLM, SamplingParams
        llm = LLM(model={str(target_dirs("llama"))!r}, enforce_eager=True, dtype="float32", max_model_len=256,
                  **{gpu_share()!r})
        out = llm.generate(["hello"], SamplingParams(max_tokens=4, temperature=0.0))[0]
        print("GENERATED", len(out.outputs[0].token_ids))
        from vllm_sparrow import patches
        print("APPLIED", len(patches.APPLIED))
        try:
            vllm.config.SpeculativeConfig(method="sparrow", model="x", num_speculative_tokens=3)
        except Exception as e:
            print("REFUSED", type(e).__name__)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GENERATED 4" in done.stdout and "APPLIED 0" in done.stdout and "REFUSED" in done.stdout
    log = done.stdout + done.stderr
    assert "vllm-sparrow supports vLLM 0.32.0, 0.33.0 and 0.34.0 only, found 0.99.0" in log
    assert "sparrow speculative method is not registered" in log


def test_a_patch_that_fails_is_undone_with_the_others():
    done = _run("""
        import dataclasses
        from vllm_sparrow import patches
        from vllm.config import SpeculativeConfig
        before = SpeculativeConfig.use_eagle

        def boom():
            raise AttributeError("vLLM moved something")

        patches.PATCHES = tuple(dataclasses.replace(r, apply=boom) if r.name == "chat-empty-prompt" else r
                                for r in patches.PATCHES)
        from vllm_sparrow.plugin import register
        register()
        print("APPLIED", len(patches.APPLIED), "RESTORED", SpeculativeConfig.use_eagle is before)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "APPLIED 0 RESTORED True" in done.stdout
    assert "could not set itself up in this vLLM (AttributeError: vLLM moved something)" in done.stdout + done.stderr


def test_a_vllm_lacking_an_internal_sparrow_reads_gets_no_patches():
    """A required read missing: nothing is applied and one line names it (as on another version);
    an optional one missing: the patches are applied and its reader's fallback is logged."""
    done = _run("""
        from vllm_sparrow import patches
        from vllm_sparrow.patch_helper import Read
        from vllm_sparrow.plugin import register
        table = patches.PATCHES
        batch = "vllm.v1.worker.gpu_input_batch.InputBatch"
        patches.PATCHES = table + (Read(f"{batch}.renamed_optional", "proposer.py", "a test", "instance",
                                        required=False),)
        register()
        print("OPTIONAL_MISSING APPLIED", len(patches.APPLIED))
        patches.revert_patches()
        patches.PATCHES = table + (Read(f"{batch}.renamed_array", "proposer.py", "a test", "instance"),)
        register()
        print("REQUIRED_MISSING APPLIED", len(patches.APPLIED))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "REQUIRED_MISSING APPLIED 0" in done.stdout
    assert "OPTIONAL_MISSING APPLIED 0" not in done.stdout and "OPTIONAL_MISSING APPLIED" in done.stdout
    log = done.stdout + done.stderr
    assert "InputBatch.renamed_optional is missing from this vLLM; proposer.py goes without it" in log
    assert ("vllm-sparrow reads vLLM internals this vLLM 0.32.0 lacks: "
            "vllm.v1.worker.gpu_input_batch.InputBatch.renamed_array (read by proposer.py)") in log
    assert "sparrow speculative method is not registered" in log


def test_general_fixes_can_be_turned_off_by_name_and_sparrow_patches_cannot():
    done = _run("""
        from vllm_sparrow import patches
        from vllm_sparrow.patch_helper import Read
        from vllm_sparrow.plugin import register
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
        upstream = OpenAIServingChat.create_chat_completion
        # a read of a fix that is off is not looked for (this one is absent: it would stop the plugin)
        patches.PATCHES += (Read("vllm.entrypoints.openai.chat_completion.serving.OpenAIServingChat.gone",
                                 "chat-empty-prompt", "a test", "class", needs=("chat-empty-prompt",)),)
        register()
        print("APPLIED", sorted(patches.APPLIED))
        print("CHAT_IS_UPSTREAM", OpenAIServingChat.create_chat_completion is upstream)
    """, SPARROW_DISABLE_PATCHES="chat-empty-prompt,pyav-video-codec,use-eagle,bogus")
    assert done.returncode == 0, done.stderr[-3000:]
    applied = done.stdout.split("APPLIED", 1)[1]
    for off in ("chat-empty-prompt", "pyav-video-codec", "video-codec-fallback"):
        assert f"'{off}'" not in applied, off
    assert "'use-eagle'" in applied and "'llava-ov-mixed-video-lengths'" in applied
    assert "CHAT_IS_UPSTREAM True" in done.stdout
    log = done.stdout + done.stderr
    assert "names 'use-eagle', which is needed by the sparrow method" in log
    assert "names 'bogus', which is no patch" in log
