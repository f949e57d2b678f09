"""The product (vllm_sparrow: plugin, drafting, training) imports neither the demo kit
(sparrow_world: world, demo models, benchmark) nor test code, and the kit imports no test code:
read from every module's import statements, lazy ones inside functions included."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_MODULES = {p.stem for p in (ROOT / "tests").glob("*.py")}


def _imports(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield path, node.module


def test_product_modules_import_no_kit_and_no_tests():
    bad = [(str(p.relative_to(ROOT)), m) for p, m in _imports("vllm_sparrow")
           if m.split(".")[0] in {"sparrow_world", "tests"} | TEST_MODULES]
    assert not bad, bad
    assert not list((ROOT / "vllm_sparrow").glob("*/testing")), "test builders live under tests/"


def test_kit_imports_the_product_but_no_tests():
    found = list(_imports("sparrow_world"))
    assert any(m.startswith("vllm_sparrow") for _, m in found)
    bad = [(str(p.relative_to(ROOT)), m) for p, m in found if m.split(".")[0] in {"tests"} | TEST_MODULES]
    assert not bad, bad
