"""README's "Train a draft" commands and docs/training.md's training block run as written, chained
as a newcomer runs them: extracted from the docs (the indented blocks), pointed at the shipped demo
target (the only edits, each placeholder asserted present, so a changed command fails here rather
than for a user), run in a fresh folder holding a data.jsonl of the bundled clips, so `cap/`,
`run/` and `data.jsonl` are the docs' own relative paths.

- README: `sparrow probe-layers` -> `sparrow capture` with `[--ivsb-layer L]` filled in with the
  layer probe-layers printed in the command it names next -> `sparrow train`: run/draft is a
  Sparrow draft for the target, IVSB at that layer; every command names the next step.
- docs/training.md: capture with the optional flags the baseline lines say they need
  (`--eagle-baseline`, `--eagle3`), the other optional parts dropped; train (optional parts
  dropped); the export in the comment under it; `train --draft-kind eagle` and `eagle3`: their
  drafts are where the documented speculative configs point. Its probe-layers line is README's
  (asserted equal), which the README test runs. The options of the dropped optional parts are
  parsed, with every other documented command, by test_documented_commands_parse.py.

`--steps 20000` is the real recipe; it runs as 20 steps (this checks the commands, not
convergence), and the baseline lines, which train the default 1,000 steps, get `--steps 20` too.
"""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from conftest import DEMO_MODELS
from transformers import AutoConfig

from vllm_sparrow.checkpoint import is_sparrow_draft, validate_draft_for_target

ROOT = Path(__file__).resolve().parents[1]
VIDEOS = ROOT / "examples" / "videos"
TARGET = str(Path(DEMO_MODELS) / "target")
STEPS = 20


def _block(doc: str, starts: str) -> str:
    """The doc's indented shell block from the line that starts with `starts`, continuation lines
    joined."""
    text = (ROOT / doc).read_text()
    block = re.search(rf"^    ({re.escape(starts)}.*?)(?:\n(?!    )|\Z)", text, flags=re.M | re.S)
    assert block, f"{doc} has no `{starts}` block"
    return block.group(1).replace("\\\n", " ")


def _commands(block: str) -> list[str]:
    return [line.strip() for line in block.splitlines() if line.strip().startswith("sparrow ")]


def _one(commands: list[str], *words: str) -> str:
    """The one command line whose words include `words`, in that order, from its start."""
    found = [c for c in commands if shlex.split(c, comments=True)[: 1 + len(words)] == ["sparrow", *words]]
    assert len(found) == 1, (words, commands)
    return found[0]


def _replace(line: str, places: dict[str, str]) -> str:
    """`line` with each placeholder (a whole word or [optional part]) replaced; each must be there."""
    for place, value in places.items():
        pattern = rf"(?<!\S){re.escape(place)}(?!\S)"
        assert re.search(pattern, line), (place, line)
        line = re.sub(pattern, value, line)
    return line


def _drop_optional(line: str, keep: tuple[str, ...] = ()) -> tuple[str, list[list[str]]]:
    """`line` without its [optional] parts (those whose text is in `keep` stay, unbracketed), and
    the options of the dropped ones, one argv per alternative of `[a | b]`."""
    dropped = []

    def one(part: re.Match) -> str:
        if part.group(1) in keep:
            return part.group(1)
        dropped.extend(shlex.split(alternative) for alternative in part.group(1).split("|"))
        return ""

    return re.sub(r"\[([^\]]+)\]", one, line), dropped


def _argv(line: str) -> list[str]:
    argv = shlex.split(line, comments=True)
    assert argv[0] == "sparrow" and not any("[" in a or "]" in a for a in argv), line  # optional parts dealt with
    return [sys.executable, "-m", "vllm_sparrow.cli", *argv[1:]]  # the venv's `sparrow`


def _run(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (argv, done.stdout[-2000:] + done.stderr[-3000:])
    return done.stdout


def _write_data(folder: Path) -> int:
    """data.jsonl in `folder`: the bundled 32 s and 96 s clips under a few prompts, the target
    writing the responses, and one sample with its response (the clip's caption)."""
    caption = {s["file"]: s["caption"] for s in json.loads((VIDEOS / "samples.json").read_text())}
    rows = [{"video": str(VIDEOS / clip), "prompt": prompt}
            for clip in ("world_32s.mp4", "world_96s.mp4") for prompt in ("describe the video .", "what moves ?")]
    rows.append({"video": str(VIDEOS / "world_32s.mp4"), "prompt": "describe the video .",
                 "response": caption["world_32s.mp4"]})
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)  # > train's default --holdout 2: training keeps samples to train on


def test_readmes_train_a_draft_commands_chain_into_a_sparrow_draft(tmp_path):
    block = _block("README.md", "sparrow probe-layers")
    commands = _commands(block)
    rows = _write_data(tmp_path)

    out = _run(_argv(_replace(_one(commands, "probe-layers"), {"TARGET": TARGET})), tmp_path)
    suggested = re.search(r"^\s*(\d+)\b.*<- suggested IVSB layer", out, re.M)
    layer = re.search(r"^next: sparrow capture .* --ivsb-layer (\d+)$", out, re.M)
    assert suggested and layer and layer.group(1) == suggested.group(1), out

    capture = _replace(_one(commands, "capture"), {"TARGET": TARGET, "[--ivsb-layer L]": f"--ivsb-layer {layer[1]}"})
    out = _run(_argv(capture), tmp_path)
    assert f"cap/: kept {rows} samples; skipped: none" in out, out
    assert "next: sparrow train --capture cap/ --out RUN" in out, out

    out = _run(_argv(_replace(_one(commands, "train"), {"--steps 20000": f"--steps {STEPS}"})), tmp_path)
    assert f"trained {STEPS} steps" in out and "simulated mean acceptance length on 2 held-out samples" in out, out
    assert "draft exported to run/draft\nnext: serve it with vllm serve TARGET --speculative-config" in out, out

    assert "run/draft is the plugin draft" in block
    draft = tmp_path / "run" / "draft"
    assert is_sparrow_draft(str(draft))
    cfg = validate_draft_for_target(str(draft), SimpleNamespace(hf_config=AutoConfig.from_pretrained(TARGET),
                                                                model=TARGET))  # what the plugin checks at start-up
    assert cfg.ivsb_layer == int(layer[1])


def test_training_docs_commands_train_a_sparrow_draft_and_both_baselines(tmp_path):
    block = _block("docs/training.md", "sparrow probe-layers")
    commands = _commands(block)
    readme = _commands(_block("README.md", "sparrow probe-layers"))
    assert shlex.split(_one(commands, "probe-layers"), comments=True) == \
        shlex.split(_one(readme, "probe-layers"), comments=True)  # run by the README test
    rows = _write_data(tmp_path)

    # The capture flags the baseline lines say they need are kept; the other optional parts dropped.
    needed = dict(re.findall(r"--draft-kind (\w+) (?:(?!--draft-kind).)*?\(capture (--[\w-]+)\)", block, flags=re.S))
    assert needed == {"eagle": "--eagle-baseline", "eagle3": "--eagle3"}, needed
    capture, dropped = _drop_optional(_replace(_one(commands, "capture"), {"TARGET": TARGET}),
                                      keep=tuple(needed.values()))
    assert ["--ivsb-layer", "L"] in dropped, dropped
    out = _run(_argv(capture), tmp_path)
    assert f"cap/: kept {rows} samples; skipped: none" in out, out
    assert "next: sparrow train --capture cap/ --out RUN" in out, out

    train, dropped = _drop_optional(_replace(_one(commands, "train", "--capture"),
                                             {"--steps 20000": f"--steps {STEPS}"}))
    assert ["--visual-drop", "0.5"] in dropped, dropped
    out = _run(_argv(train), tmp_path)
    assert f"trained {STEPS} steps" in out, out
    assert "draft exported to run/draft\nnext: serve it with vllm serve TARGET" in out, out
    assert "run/draft is the plugin draft" in block and is_sparrow_draft(str(tmp_path / "run" / "draft"))

    export = re.search(r"`(sparrow export [^`]*)`", block)
    assert export, block
    out = _run(_argv(_replace(export[1], {"DIR": str(tmp_path / "exported")})), tmp_path)
    assert "next: serve it with vllm serve TARGET" in out, out
    assert is_sparrow_draft(str(tmp_path / "exported"))

    for kind in ("eagle", "eagle3"):
        line = _one(commands, "train", "--draft-kind", kind)
        assert "--steps" not in line, line  # else the placeholder rule above applies
        out = _run([*_argv(line), "--steps", str(STEPS)], tmp_path)
        assert f"trained {STEPS} steps" in out and f"draft exported to run-{kind}/draft\nnext: " in out, out
        named = json.loads(re.search(r"--speculative-config '(.*)'$", out, re.M)[1])  # the config the command names
        assert named["method"] == kind and named["model"] == f"run-{kind}/draft" and named["num_speculative_tokens"] >= 1
        served = json.loads(re.search(rf'\{{"method": "{kind}".*?\}}', block)[0])  # the documented config
        draft = tmp_path / served["model"]
        architecture = json.loads((draft / "config.json").read_text())["architectures"]
        assert not is_sparrow_draft(str(draft))  # a draft of vLLM's own method, not the plugin's
        assert architecture == (["LlamaForCausalLMEagle3"] if kind == "eagle3" else ["LlamaForCausalLM"]), architecture
