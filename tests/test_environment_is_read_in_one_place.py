"""Every SPARROW_* variable is read through vllm_sparrow/envs.py: one table (name -> parser,
default, docs), read from os.environ at each access; no other module of the package reads one
from os.environ (read from the source); docs/serving.md's list is the table as generated."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_sparrow import envs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vllm_sparrow"
SERVING = ROOT / "docs" / "serving.md"


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "envs.py")


def _environ_reads(tree: ast.AST):
    """(line, key node) of each os.environ[...] / os.environ.get(...) / os.getenv(...) in tree."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        is_environ = (isinstance(node, ast.Attribute) and node.attr == "environ") or \
            (isinstance(node, ast.Name) and node.id == "environ")
        up = parents.get(node)
        if is_environ and isinstance(up, ast.Subscript) and up.value is node:
            yield node.lineno, up.slice
        elif is_environ and isinstance(up, ast.Attribute) and up.attr in ("get", "pop", "setdefault"):
            call = parents.get(up)
            if isinstance(call, ast.Call) and call.args:
                yield node.lineno, call.args[0]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "getenv":
            if node.args:
                yield node.lineno, node.args[0]


def test_no_module_but_envs_reads_a_sparrow_variable_from_os_environ():
    bad = []
    for path in _modules():
        for line, key in _environ_reads(ast.parse(path.read_text(), str(path))):
            named = isinstance(key, ast.Constant) and isinstance(key.value, str)
            # A key held in a name hides which variable it is (lifetime.py's old ENV): refused too.
            if not named or key.value.startswith("SPARROW_"):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {ast.unparse(key)}")
    assert not bad, "read these through vllm_sparrow.envs: " + ", ".join(bad)


def test_each_variable_is_read_where_the_table_says_and_every_name_used_is_in_the_table():
    declared = {(m, name) for name, v in envs.VARIABLES.items() for m in v.read_in}
    used, mentioned = set(), set()
    for path in _modules():
        text = path.read_text()
        where = path.relative_to(PACKAGE).as_posix()  # "drafting/choice.py"
        used |= {(where, n) for n in re.findall(r"envs\.(SPARROW_\w+)", text)}
        used |= {(where, n) for n in re.findall(r"envs\.export\(\"(SPARROW_\w+)\"", text)}
        mentioned |= set(re.findall(r"\bSPARROW_[A-Z0-9_]*[A-Z0-9]", text))
    assert used == declared
    known = set(envs.VARIABLES) | set(envs.SETUP_VARIABLES)
    assert mentioned <= known, mentioned - known  # messages name real variables


def test_variables_are_read_at_each_access_not_at_import(monkeypatch):
    for name in envs.VARIABLES:
        monkeypatch.delenv(name, raising=False)
        assert getattr(envs, name) == envs.VARIABLES[name].default, name
        monkeypatch.setenv(name, "  ")  # blank: as unset
        assert getattr(envs, name) == envs.VARIABLES[name].default, name
    monkeypatch.setenv("SPARROW_STOP_CONFIDENCE", "0.9")
    assert envs.SPARROW_STOP_CONFIDENCE == 0.9
    monkeypatch.setenv("SPARROW_STOP_CONFIDENCE", " OFF ")
    assert envs.SPARROW_STOP_CONFIDENCE == "off"
    monkeypatch.setenv("SPARROW_TREE_TOPK", "4")
    assert envs.SPARROW_TREE_TOPK == 4
    monkeypatch.setenv("SPARROW_DRAFT_GRAPHS", "Eager")
    assert envs.SPARROW_DRAFT_GRAPHS == "eager"
    monkeypatch.setenv("SPARROW_DISABLE_PATCHES", "a, b,,")
    assert envs.SPARROW_DISABLE_PATCHES == {"a", "b"}
    monkeypatch.setenv("SPARROW_KILL_AT_WRITE", "2:records")
    assert envs.SPARROW_KILL_AT_WRITE == (2, "records")
    monkeypatch.setenv("SPARROW_KILL_AT_WRITE", "3")
    assert envs.SPARROW_KILL_AT_WRITE == (3, "")
    with pytest.raises(AttributeError):
        envs.SPARROW_NO_SUCH_VARIABLE


@pytest.mark.parametrize("name, value, message", [
    ("SPARROW_STOP_CONFIDENCE", "high", "SPARROW_STOP_CONFIDENCE='high': use a probability in (0, 1) or 'off'"),
    ("SPARROW_STOP_CONFIDENCE", "1.5", "SPARROW_STOP_CONFIDENCE=1.5: use a probability in (0, 1) or 'off'"),
    ("SPARROW_TREE_TOPK", "Two", "SPARROW_TREE_TOPK='two': use a whole number >= 1 or 'off'"),
    ("SPARROW_TREE_BUDGET", "0", "SPARROW_TREE_BUDGET=0: use a whole number >= 1 or 'off'"),
    ("SPARROW_DRAFT_GRAPHS", "yes", "SPARROW_DRAFT_GRAPHS='yes': use 'off' or 'eager' (or leave it unset)"),
    ("SPARROW_ATTENTION_BACKEND", "Flash", "SPARROW_ATTENTION_BACKEND='flash': use 'torch' or 'triton' (or leave it unset)"),
    ("SPARROW_DRAFT_VOCAB", "small", "SPARROW_DRAFT_VOCAB='small': use 'full' (or leave it unset)"),
    ("SPARROW_KILL_AT_WRITE", "x:records", "SPARROW_KILL_AT_WRITE='x:records': use N or N:text"),
])
def test_a_value_a_variable_does_not_take_fails_naming_it(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        getattr(envs, name)


def test_the_guard_and_the_verifier_switch_never_fail_on_a_value(monkeypatch):
    """The parent-death guard must never stop vLLM (a bad pid is no pid); the verifier switch is
    "1" exactly, anything else leaving the check on."""
    monkeypatch.setenv("SPARROW_PARENT_PID", "abc")
    assert envs.SPARROW_PARENT_PID is None
    monkeypatch.setenv("SPARROW_ALLOW_OTHER_VERIFIER", "true")
    assert envs.SPARROW_ALLOW_OTHER_VERIFIER is False
    monkeypatch.setenv("SPARROW_ALLOW_OTHER_VERIFIER", "1")
    assert envs.SPARROW_ALLOW_OTHER_VERIFIER is True


def test_the_command_exports_its_pid_for_the_processes_it_starts(monkeypatch):
    import os

    from vllm_sparrow import lifetime

    monkeypatch.setenv("SPARROW_PARENT_PID", "")  # blank is unset; monkeypatch restores the original
    assert lifetime.command_pid() is None
    monkeypatch.setattr(lifetime, "_install_fork_hook", lambda: None)  # no hook left in the test process
    lifetime.record_command()
    assert os.environ["SPARROW_PARENT_PID"] == str(os.getpid()) and lifetime.command_pid() == os.getpid()
    with pytest.raises(KeyError, match="not a variable"):
        envs.export("SPARROW_UNDECLARED", 1)


def test_envs_imports_nothing_heavy():
    """Any module may import it, the draft core and training included: no torch, no vLLM."""
    code = "import sys, vllm_sparrow.envs; print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_serving_docs_list_the_variables_as_generated():
    text = SERVING.read_text()
    block = envs.BLOCK.search(text)
    assert block, "docs/serving.md lost its <!-- generated: envs --> block"
    assert block[2] == envs.table_markdown(), "regenerate: python -m vllm_sparrow.envs docs/serving.md"
    assert envs.rewrite_block(text) == text
