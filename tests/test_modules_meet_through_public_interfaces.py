"""The product's modules meet through public interfaces: no module of vllm_sparrow/ calls or
imports another module's private names (`drafter._forward(` from the tree search was one; the
CUDA-graph code called three of the drafter's), and the imports (module level and inside functions) have no cycle, between modules or between rooms.
Read from the source (ast), so a new shortcut fails here, not in review."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vllm_sparrow"


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _private_defs(tree: ast.Module) -> set[str]:
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {n.name for n in ast.walk(tree) if isinstance(n, kinds) and _private(n.name)}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_calls_or_imports_another_modules_private_names():
    modules = _modules()
    defined = {name: _private_defs(tree) for name, tree in modules.items()}
    owners: dict[str, set[str]] = {}
    for name, names in defined.items():
        for n in names:
            owners.setdefault(n, set()).add(name)
    bad = []
    for name, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _private(node.func.attr):
                owner = node.func.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if node.func.attr in owners and node.func.attr not in defined[name]:
                    bad.append(f"{name}:{node.lineno} calls {ast.unparse(node.func)} "
                               f"(private to {', '.join(sorted(owners[node.func.attr]))})")
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("vllm_sparrow")):
                bad += [f"{name}:{node.lineno} imports {a.name}" for a in node.names if _private(a.name)]
    assert not bad, "\n".join(bad)


def _imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """Package modules `name` imports, at module level or inside functions (a lazy import is an
    arrow all the same), not under TYPE_CHECKING."""
    hidden = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
              for n in ast.walk(node)}
    found = set()
    package = name if name.endswith("__init__") else name.rsplit(".", 1)[0]
    if (PACKAGE / Path(*name.split(".")[1:]) / "__init__.py").exists():
        package = name  # a package's own __init__: its relative imports start inside it
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                for cand in (f"{base}.{a.name}", base):
                    if cand in known:
                        found.add(cand)
                        break
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
    return found - {name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def _room(module: str) -> str:
    """The room a module belongs to: its file under vllm_sparrow/, or its sub-package (drafting/)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_imports_have_no_cycle_between_modules():
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, tree, known) for name, tree in modules.items()}
    found = _cycle(graph)
    assert found is None, "import cycle: " + " -> ".join(found)
    assert graph["vllm_sparrow.drafter"] >= {"vllm_sparrow.drafting.step"}  # the reader resolves imports
    assert "vllm_sparrow.training.engine_target" in graph["vllm_sparrow.training.capture"]  # and lazy ones


def test_imports_have_no_cycle_between_rooms():
    """Files and sub-packages as rooms: no two import each other, however indirectly (a strategy
    of drafting/ importing drafter.py while drafter.py imports drafting/ was one; patches.py
    importing v2_runner/ while v2_runner/ imported patches.py another). So the rooms stack in
    floors, every arrow pointing down."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, tree in modules.items():
        if name == "vllm_sparrow":
            continue  # the package's face, imported by everything
        room = _room(name)
        graph.setdefault(room, set())
        graph[room] |= {_room(m) for m in _imports(name, tree, known) if m != "vllm_sparrow"} - {room}
    found = _cycle(graph)
    assert found is None, "rooms in a circle: " + " -> ".join(found)
