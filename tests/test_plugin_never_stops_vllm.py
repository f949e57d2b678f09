"""Installing vllm-sparrow never stops vLLM from starting: on another vLLM version the plugin logs
one line and registers nothing (plain vLLM serves; `sparrow` is refused as an unknown method), and
so it does on a vLLM that lacks an internal Sparrow reads; a patch that fails to apply is undone
with the rest; each general vLLM fix can be turned off by name (its reads are then not checked).

The other version runs in a process of its own (vLLM reads its version once). The three table
cases share one process, one after another, each starting from vLLM as released: the plugin's
undo (revert_patches) puts back what each case applied, and the process checks that it did
before the next case starts, so a case never inherits another's patches. One process instead of
three saves two vLLM imports (about 12 s each here)."""

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import gpu_share

from vllm_sparrow import read_check
from vllm_sparrow.releases import install_hint


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
            print("REFUSED", type(e).__name__, str(e).replace("\\n", " "))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GENERATED 4" in done.stdout and "APPLIED 0" in done.stdout
    assert "REFUSED" in done.stdout and "Input should be 'ngram'" in done.stdout  # vLLM's own unknown-method error
    log = done.stdout + done.stderr
    assert f"vllm-sparrow supports vLLM {read_check.supported_versions_text()} only, found 0.99.0" in log
    assert install_hint() in log and "vllm==0.32.0 or vllm==0.33.0 or vllm==0.34.0" in install_hint()
    assert "sparrow speculative method is not registered" in log


# One process, three cases: each prints its lines between "== case NAME ==" and "== end ==", on one
# stream (stderr, where vLLM's logger writes too), so each test reads its own case's log.
CASES = r"""
import dataclasses, os, sys
from vllm_sparrow import patches
from vllm_sparrow.patch_helper import Read
from vllm_sparrow.plugin import register
from vllm.config import SpeculativeConfig
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat

TABLE = patches.PATCHES
RELEASED = (SpeculativeConfig.use_eagle, OpenAIServingChat.create_chat_completion)


def say(*words):
    print(*words, file=sys.stderr, flush=True)


def case(name):
    say(f"== case {name} ==")


def end():
    patches.revert_patches()
    patches.PATCHES = TABLE
    os.environ.pop("SPARROW_DISABLE_PATCHES", None)
    now = (SpeculativeConfig.use_eagle, OpenAIServingChat.create_chat_completion)
    say("AS_RELEASED", not patches.APPLIED and now == RELEASED)
    say("== end ==")


case("a patch that fails")


def boom():
    raise AttributeError("vLLM moved something")


patches.PATCHES = tuple(dataclasses.replace(r, apply=boom) if r.name == "chat-empty-prompt" else r for r in TABLE)
register()
say("APPLIED", len(patches.APPLIED), "RESTORED", SpeculativeConfig.use_eagle is RELEASED[0])
end()

case("a read missing")
batch = "vllm.v1.worker.gpu_input_batch.InputBatch"
patches.PATCHES = TABLE + (Read(f"{batch}.renamed_optional", "proposer.py", "a test", "instance", required=False),)
register()
say("OPTIONAL_MISSING APPLIED", len(patches.APPLIED))
patches.revert_patches()
patches.PATCHES = TABLE + (Read(f"{batch}.renamed_array", "proposer.py", "a test", "instance"),)
register()
say("REQUIRED_MISSING APPLIED", len(patches.APPLIED))
end()

case("fixes turned off")
upstream = OpenAIServingChat.create_chat_completion
os.environ["SPARROW_DISABLE_PATCHES"] = "chat-empty-prompt,pyav-video-codec,use-eagle,bogus"
# a read of a fix that is off is not looked for (this one is absent: it would stop the plugin)
patches.PATCHES = TABLE + (Read("vllm.entrypoints.openai.chat_completion.serving.OpenAIServingChat.gone",
                                "chat-empty-prompt", "a test", "class", needs=("chat-empty-prompt",)),)
register()
say("APPLIED", sorted(patches.APPLIED))
say("CHAT_IS_UPSTREAM", OpenAIServingChat.create_chat_completion is upstream)
end()
"""


@pytest.fixture(scope="module")
def cases() -> dict[str, str]:
    """Each case's log (its own lines and vLLM's, in order), by case name."""
    env = {k: v for k, v in os.environ.items() if k != "SPARROW_DISABLE_PATCHES"}
    done = subprocess.run([sys.executable, "-c", CASES], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    logs = {}
    for part in done.stdout.split("== case ")[1:]:
        name, _, rest = part.partition(" ==\n")
        logs[name], _, _ = rest.partition("== end ==")
        assert "AS_RELEASED True" in logs[name], (name, logs[name][-3000:])  # nothing left for the next case
    return logs


def test_a_patch_that_fails_is_undone_with_the_others(cases):
    log = cases["a patch that fails"]
    assert "APPLIED 0 RESTORED True" in log
    assert "could not set itself up in this vLLM (AttributeError: vLLM moved something)" in log


def test_a_vllm_lacking_an_internal_sparrow_reads_gets_no_patches(cases):
    """A required read missing: nothing is applied and one line names it (as on another version);
    an optional one missing: the patches are applied and its reader's fallback is logged."""
    log = cases["a read missing"]
    assert "REQUIRED_MISSING APPLIED 0" in log
    assert "OPTIONAL_MISSING APPLIED 0" not in log and "OPTIONAL_MISSING APPLIED" in log
    assert "InputBatch.renamed_optional is missing from this vLLM; proposer.py goes without it" in log
    assert ("vllm-sparrow reads vLLM internals this vLLM 0.32.0 lacks: "
            "vllm.v1.worker.gpu_input_batch.InputBatch.renamed_array (read by proposer.py)") in log
    assert "sparrow speculative method is not registered" in log


def test_general_fixes_can_be_turned_off_by_name_and_sparrow_patches_cannot(cases):
    log = cases["fixes turned off"]
    applied = log.split("APPLIED", 1)[1].split("\n", 1)[0]
    for off in ("chat-empty-prompt", "pyav-video-codec", "video-codec-fallback"):
        assert f"'{off}'" not in applied, off
    assert "'use-eagle'" in applied and "'llava-ov-mixed-video-lengths'" in applied
    assert "CHAT_IS_UPSTREAM True" in log
    assert "names 'use-eagle', which is needed by the sparrow method" in log
    assert "names 'bogus', which is no patch" in log
