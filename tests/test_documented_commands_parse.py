"""Every command the docs show parses with today's options, so a renamed or removed flag breaks a
test, not a newcomer's first try: the `sparrow ...` lines of README's and docs/'s code blocks
(each `[--option ...]` group and each `a | b` alternative in it added on its own), and every
published run's command (benchmarks/publish.py, rendered under each table), `sparrow` ones by the
CLI's parser, `python benchmarks/X.py` ones by the script's own parser (which imports the script).

Running them is other tests' work: README's serve, caption, Python and training examples run as
written; the bench, demo build and published runs take minutes to hours and run as
`sparrow bench --quick` and `sparrow demo`."""

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _code_block_commands(text: str) -> list[str]:
    """`sparrow ...` commands of the indented (4-space) code blocks, continuations joined, comments cut."""
    commands, current = [], None
    for line in text.splitlines():
        code = line[4:] if line.startswith("    ") else None
        if current is not None:
            current += " " + (code or "").strip()
        elif code is not None and code.startswith("sparrow "):
            current = code
        if current is not None and not current.rstrip().endswith("\\"):
            commands.append(current.split("  #")[0].split(" # ")[0].strip())
            current = None
        elif current is not None:
            current = current.rstrip()[:-1]
    return commands


def _variants(command: str) -> list[list[str]]:
    """The command without its optional groups, then with each group's each alternative added.
    One-letter placeholders stand for numbers (`--ivsb-layer L`, `--draft-vocab N`): 1."""
    groups = re.findall(r"\[([^\]]+)\]", command)
    base = shlex.split(re.sub(r"\[[^\]]+\]", " ", command))
    variants = [base] + [base + shlex.split(alt) for group in groups for alt in group.split("|")]
    return [["1" if re.fullmatch(r"[A-Z]", a) else a for a in argv] for argv in variants]


def _documented() -> list[tuple[str, str]]:
    found = [(doc.name, c) for doc in DOCS for c in _code_block_commands(doc.read_text())]
    assert len(found) >= 8, found  # README's and docs/training.md's blocks at least: the reader works
    return found


def _published() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("publish", ROOT / "benchmarks" / "publish.py")
    publish = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(publish)
    return {name: command for name, (command, _) in publish.RUNS.items()}


def _parse_sparrow(argv: list[str]) -> argparse.Namespace:
    from vllm_sparrow.cli import build_parser

    assert argv[0] == "sparrow", argv
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as e:  # argparse printed why
        raise AssertionError(f"does not parse: {' '.join(argv)}") from e


@pytest.mark.parametrize("where,command", _documented(), ids=lambda v: v if v.endswith(".md") else v[:60])
def test_every_documented_sparrow_command_parses(where, command):
    for argv in _variants(command):
        _parse_sparrow(argv)


class _Parsed(Exception):
    pass


def test_every_published_command_parses_with_its_own_parser(monkeypatch):
    """Including the benchmark scripts: each is imported and its main() stopped right after it
    parsed the published arguments (nothing is run)."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    for name, command in _published().items():
        argv = shlex.split(command)
        if argv[0] == "sparrow":
            _parse_sparrow(argv)
            continue
        assert argv[0] == "python" and argv[1].startswith("benchmarks/"), command
        spec = importlib.util.spec_from_file_location(f"published_{name.replace('-', '_')}", ROOT / argv[1])
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        with monkeypatch.context() as m:
            m.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
            with pytest.raises(_Parsed):
                script.main(argv[2:])


def test_every_benchmark_script_imports():
    """README and docs point to these; one that names a renamed kernel fails on import."""
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert len(scripts) >= 5
    for path in scripts:
        spec = importlib.util.spec_from_file_location(f"bench_script_{path.stem}", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
