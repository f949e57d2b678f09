"""Checks every vLLM touch the plugin declares (vllm_sparrow.patches.PATCHES) and every vLLM import
of the product's modules against a vLLM *source tree*, read with `ast`, never imported: a wheel
(any build: the GPU wheel checks a vLLM version this machine cannot install), a version (its GPU
wheel is downloaded without dependencies into .cache/vllm-wheels/), or a folder holding the `vllm`
package (the installed one: --installed).

    python tools/vllm_source_check.py --wheel 0.33.0
    python tools/vllm_source_check.py --wheel path/to/vllm-0.33.0-...whl
    python tools/vllm_source_check.py --installed
    python tools/vllm_source_check.py --release all     # each release of vllm_sparrow/releases.py

One line per row and import (found, MISSING, or skipped with why); exit 1 when one is missing.
The start-up check (read_check.missing_reads) looks at the installed vLLM's objects; this one finds
the same targets in source, so a vLLM release can be checked before it is installed anywhere:
  - rows of this version only: a row made for another vLLM version is skipped, as at runtime;
  - platform rows: the GPU wheel carries the CPU platform's source too, so "cpu" rows are checked
    where their module's source exists and skipped (saying so) where it does not;
  - "documented" reads are skipped: they name no vLLM path (the target model's own methods).
Resolution follows the module (file or package), its module-level names (definitions, imports
and re-exports, a module `__getattr__`'s lazy table), classes and their bases across modules,
`self.x = ...` assignments (as the runtime check reads STORE_ATTR), dataclass fields, instances
(`Name = Class(...)`), and mapping entries (`X.__annotations__['k']`, `vars(mod)['k']`, `X['k']`).
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEEL_CACHE = ROOT / ".cache" / "vllm-wheels"  # gitignored: wheels never enter the repository
OBJECT_ATTRS = frozenset(dir(object))  # every class has these (e.g. __new__), defined or not


# ---- where the source comes from -------------------------------------------------------------
class SourceTree:
    """The .py files of a vLLM package, read from a wheel (zip members) or from a folder that
    holds the `vllm` package; only what a check asks for is read, and each file is parsed once."""

    def __init__(self, where: Path) -> None:
        where = Path(where)
        self.where = where
        self._zip = zipfile.ZipFile(where) if where.suffix == ".whl" else None
        if self._zip is None and (where / "__init__.py").is_file() and where.name == "vllm":
            where = where.parent  # the package folder itself was given
        self._root = where
        self._parsed: dict[str, ast.Module | None] = {}
        self._texts: dict[str, str] = {}

    def _read(self, rel: str) -> str | None:
        if self._zip is not None:
            try:
                return self._zip.read(rel).decode("utf-8")
            except KeyError:
                return None
        path = self._root / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def module_file(self, module: str) -> str | None:
        """The relative path of a module's source (file, or a package's __init__.py), or None."""
        base = module.replace(".", "/")
        for rel in (f"{base}.py", f"{base}/__init__.py"):
            if rel not in self._texts:
                text = self._read(rel)
                if text is None:
                    continue
                self._texts[rel] = text
            return rel
        return None

    def module(self, module: str) -> ast.Module | None:
        rel = self.module_file(module)
        if rel is None:
            return None
        if rel not in self._parsed:
            self._parsed[rel] = ast.parse(self._texts[rel], rel)
        return self._parsed[rel]

    def is_package(self, module: str) -> bool:
        rel = self.module_file(module)
        return rel is not None and rel.endswith("__init__.py")

    def build(self) -> str:
        """"cpu" for vLLM's CPU build (it ships the _C_AVX2/_C_AVX512 extensions), else "cuda"."""
        if self._zip is not None:
            names = self._zip.namelist()
        else:
            names = [f"vllm/{p.name}" for p in (self._root / "vllm").glob("_C_AVX*")]
        return "cpu" if any(n.startswith("vllm/_C_AVX") for n in names) else "cuda"

    def version(self) -> str | None:
        """vLLM's version as the tree records it (vllm/_version.py), without its local part."""
        text = self._read("vllm/_version.py") or ""
        found = re.search(r"""(?:__version__|version)\s*(?::[^=]*)?=\s*['"]([^'"]+)['"]""", text)
        return found.group(1).split("+")[0] if found else None


# ---- ast lookups ------------------------------------------------------------------------------
def _arguments(args: ast.arguments) -> list[str]:
    """A def's parameter names in inspect.signature's order."""
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    names += [args.vararg.arg] if args.vararg else []
    names += [a.arg for a in args.kwonlyargs] + ([args.kwarg.arg] if args.kwarg else [])
    return names


def _statements(body: list[ast.stmt]):
    """The statements of a module or class body, descending into if/try/with blocks (names they
    bind exist at runtime on some path), but not into `if TYPE_CHECKING:` (never run)."""
    for node in body:
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if "TYPE_CHECKING" not in test:
                yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _statements(block)
        elif isinstance(node, ast.With):
            yield from _statements(node.body)
        else:
            yield node


def _assigned_names(node: ast.stmt) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names = []
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                names.append(sub.id)
    return names


def _membership_keys(fn: ast.FunctionDef, tree: ast.Module) -> set:
    """The literal keys of the module-level dicts a module `__getattr__` tests its argument's
    membership in (vllm.envs: `if name in environment_variables: return environment_variables[name]()`)."""
    arg = fn.args.args[0].arg if fn.args.args else None
    tables = {c.id for node in ast.walk(fn) if isinstance(node, ast.Compare)
              and isinstance(node.left, ast.Name) and node.left.id == arg and isinstance(node.ops[0], ast.In)
              for c in node.comparators if isinstance(c, ast.Name)}
    keys = set()
    for node in _statements(tree.body):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict) \
                and tables & set(_assigned_names(node)):
            keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return keys


def _compares_name(fn: ast.FunctionDef, name: str) -> bool:
    """Whether a module `__getattr__` tests its argument against the literal `name`."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Constant) and sub.value == name:
                    return True
    return False


@dataclass
class Found:
    """What a name resolved to: a module, a class (its node and module), an instance of a class,
    or some other value (a function, a constant) that has no attributes to look into."""

    kind: str  # "module", "class", "instance", "value"
    module: str
    node: ast.AST | None = None


class Resolver:
    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree

    # -- module-level names --
    def module_name(self, module: str, name: str, seen=None) -> Found | None:
        """What `module.name` is: a definition or import in the module, a submodule, or an entry
        of the module's lazy `__getattr__` table."""
        seen = seen if seen is not None else set()
        if (module, name) in seen:
            return None
        seen.add((module, name))
        tree = self.tree.module(module)
        if tree is None:
            return None
        found = self._bound_in(module, tree.body, name, seen)
        if found is not None:
            return found
        if self.tree.is_package(module) and self.tree.module_file(f"{module}.{name}") is not None:
            return Found("module", f"{module}.{name}")
        return self._lazy(module, tree, name, seen)

    def _bound_in(self, module: str, body, name: str, seen) -> Found | None:
        found = None  # the last binding wins, as at runtime
        for node in _statements(body):
            if isinstance(node, ast.ClassDef) and node.name == name:
                found = Found("class", module, node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                found = Found("value", module, node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _assigned_names(node):
                found = self._value(module, node.value, seen) if node.value is not None else Found("value", module)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self._absolute(module, node)
                        found = self.module_name(source, alias.name, seen)
                        if found is None and self.tree.module_file(source) is None:
                            found = Found("value", source)  # from outside vLLM (typing, torch): a value
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname == name:
                        found = Found("module", alias.name)
                    elif alias.asname is None and alias.name.split(".")[0] == name:
                        found = Found("module", name)
        return found

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = module if self.tree.is_package(module) else module.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            package = package.rsplit(".", 1)[0]
        return f"{package}.{node.module}" if node.module else package

    def _value(self, module: str, value: ast.expr | None, seen) -> Found:
        """What an assigned value is: an alias of a name, an instance (`Class(...)`), or a value."""
        if isinstance(value, (ast.Name, ast.Attribute)):
            return self.expression(module, value, seen) or Found("value", module, value)
        if isinstance(value, ast.Call):
            cls = self.expression(module, value.func, seen)
            if cls is not None and cls.kind == "class":
                return Found("instance", cls.module, cls.node)
        return Found("value", module, value)

    def expression(self, module: str, expr: ast.expr, seen=None) -> Found | None:
        """A dotted name as written in `module` (a base class, an aliased value)."""
        seen = seen if seen is not None else set()
        if isinstance(expr, ast.Subscript):  # Generic[T], Base[X]: the class subscripted
            return self.expression(module, expr.value, seen)
        if isinstance(expr, ast.Name):
            return self.module_name(module, expr.id, seen)
        if isinstance(expr, ast.Attribute):
            owner = self.expression(module, expr.value, seen)
            return self.attribute(owner, expr.attr) if owner is not None else None
        return None

    def _lazy(self, module: str, tree: ast.Module, name: str, seen) -> Found | None:
        """A name a module's `__getattr__` serves: one it compares its argument with, or a key of
        a literal table {"Name": "pkg.mod:Name"} (or ".mod:Name", or "pkg.mod"): the table's target."""
        getattr_fn = next((n for n in _statements(tree.body)
                           if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"), None)
        if getattr_fn is None:
            return None
        if _compares_name(getattr_fn, name):  # `if name == "current_platform": ...`
            return Found("value", module)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values):
                if (isinstance(key, ast.Constant) and key.value == name and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)):
                    where, _, attr = value.value.partition(":")
                    if where.startswith("."):
                        where = (module if self.tree.is_package(module) else module.rsplit(".", 1)[0]) + where
                    return self.module_name(where, attr or name, seen) if attr else Found("module", where)
        if name in _membership_keys(getattr_fn, tree):  # `if name in environment_variables: ...`
            return Found("value", module)
        return None

    # -- attributes of what a name resolved to --
    def attribute(self, owner: Found, name: str) -> Found | None:
        if owner.kind == "module":
            return self.module_name(owner.module, name)
        if owner.kind in ("class", "instance"):
            found = self.class_attr(owner, name)
            if found is None and owner.kind == "instance" and self.instance_attr(owner, name):
                found = Found("value", owner.module)
            return found
        return None

    def bases(self, cls: Found) -> list[Found]:
        """The classes cls derives from that are vLLM source (others, like torch's, cannot be read)."""
        out = []
        for base in cls.node.bases:
            found = self.expression(cls.module, base)
            if found is not None and found.kind == "class":
                out.append(Found("class", found.module, found.node))
        return out

    def mro(self, cls: Found) -> list[Found]:
        order, todo = [], [cls]
        while todo:
            klass = todo.pop(0)
            if all(k.node is not klass.node for k in order):
                order.append(klass)
                todo.extend(self.bases(klass))
        return order

    def class_attr(self, cls: Found, name: str) -> Found | None:
        """A name bound in the body of the class or a base (method, property, class variable,
        annotated field); what every class has (object's attributes) counts as found."""
        for klass in self.mro(cls):
            found = self._bound_in(klass.module, klass.node.body, name, set())
            if found is not None:
                return found
            if any(isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name
                   for n in _statements(klass.node.body)):
                return Found("value", klass.module)
        return Found("value", cls.module) if name in OBJECT_ATTRS else None

    def field(self, cls: Found, name: str) -> bool:
        """A dataclass field: an annotated name in the body of a decorated class or a base (as
        `__dataclass_fields__` holds, ClassVars included)."""
        for klass in self.mro(cls):
            if not klass.node.decorator_list:
                continue
            if any(isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name
                   for n in _statements(klass.node.body)):
                return True
        return False

    def instance_attr(self, cls: Found, name: str) -> bool:
        """Assigned as `<x>.name = ...` in code of the class or a base (what the runtime check
        finds as a STORE_ATTR in the methods' bytecode)."""
        for klass in self.mro(cls):
            for node in ast.walk(klass.node):
                if isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Store):
                    return True
        return False

    # -- a dotted target --
    def dotted(self, target: str) -> tuple[Found | None, str, str]:
        """(owner, last name, what was not found) of a dotted path: the longest prefix that is a
        module in the tree, then names inside it."""
        parts = target.split(".")
        for i in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:i])
            if self.tree.module_file(module) is None:
                continue
            owner: Found | None = Found("module", module)
            for j, name in enumerate(parts[i:-1], start=i):
                owner = self.attribute(owner, name)
                if owner is None:
                    return None, parts[-1], ".".join(parts[: j + 1])
            return owner, parts[-1], ""
        return None, parts[-1], f"no module of {target}"


# ---- checks ------------------------------------------------------------------------------------
@dataclass
class Result:
    what: str  # "replaces", "reads", "import"
    target: str
    status: str  # "found", "MISSING", "skipped"
    detail: str = ""
    by: str = ""

    def line(self) -> str:
        said = ", ".join(filter(None, [self.by if self.what == "import" else "", self.detail]))
        tail = f" ({said})" if said else ""
        return f"{self.status:8} {self.what:8} {self.target}{tail}"


_ENTRY = re.compile(r"^(?P<owner>.+?)\[(?P<key>'[^']*'|\"[^\"]*\")\]$")
_VARS = re.compile(r"^vars\((?P<module>[\w.]+)\)$")


def check_target(resolver: Resolver, target: str, check: str, params: tuple[str, ...] = ()) -> tuple[bool, str]:
    """(found, detail) for one row's target, found as `check` says ("replaces" for patches; a
    "signature" row's method must have exactly `params`)."""
    entry = _ENTRY.match(target)
    if entry:
        return _check_entry(resolver, entry.group("owner"), ast.literal_eval(entry.group("key")))
    owner, name, missing = resolver.dotted(target)
    if owner is None:
        return False, f"{missing} not found"
    if check == "field":
        ok = owner.kind == "class" and resolver.field(owner, name)
        return ok, "" if ok else f"no dataclass field {name}"
    if check == "instance":
        ok = owner.kind == "class" and resolver.instance_attr(owner, name)
        return ok, "" if ok else f"nothing assigns .{name} in the class or its bases"
    if check == "signature":
        found = resolver.attribute(owner, name)
        if found is None or not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False, f"no method {name} in {target.rsplit('.', 1)[0]}"
        from vllm_sparrow.patch_helper import parameter_names

        names = parameter_names(_arguments(found.node.args))
        return names == params, "" if names == params else f"its parameters are ({', '.join(names)})"
    ok = resolver.attribute(owner, name) is not None  # "class" reads and "replaces" rows
    return ok, "" if ok else f"no {name} in {target.rsplit('.', 1)[0]}"


def _check_entry(resolver: Resolver, owner_path: str, key: str) -> tuple[bool, str]:
    """A mapping entry a patch sets: `X.__annotations__['k']` (the class must annotate k),
    `vars(mod)['k']` (the module must bind k), or `X['k']` (the mapping X must exist; the entry
    is added, so its absence is expected and its presence is reported)."""
    modvars = _VARS.match(owner_path)
    if modvars:
        ok = resolver.module_name(modvars.group("module"), key) is not None
        return ok, "" if ok else f"no {key} in {modvars.group('module')}"
    if owner_path.endswith(".__annotations__"):
        owner, name, missing = resolver.dotted(owner_path.removesuffix(".__annotations__"))
        klass = resolver.attribute(owner, name) if owner is not None else None
        if klass is None or klass.kind != "class":
            return False, f"{owner_path.removesuffix('.__annotations__')} not found"
        ok = any(isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == key
                 for n in _statements(klass.node.body))
        return ok, "" if ok else f"the class annotates no {key}"
    owner, name, missing = resolver.dotted(owner_path)
    container = resolver.attribute(owner, name) if owner is not None else None
    if container is None:
        return False, f"{missing or owner_path} not found"
    present = _literal_keys(container)
    return True, f"entry {key!r} already upstream: replaced, not added" if key in present else "entry added"


def _literal_keys(found: Found) -> set:
    node = found.node.value if isinstance(found.node, (ast.Assign, ast.AnnAssign)) else found.node
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys if isinstance(k, ast.Constant)}
    return set()


def row_applies(row, version: str) -> tuple[bool, str]:
    """Whether a row is checked for this vLLM version (as apply_patches would use it), and why not."""
    from vllm_sparrow.patch_helper import for_version

    if not for_version(row, version):  # the rule apply_patches follows
        return False, f"a row for vLLM {', '.join(row.vllm_versions)} only"
    if row.kind == "reads" and row.check == "documented":
        return False, "documented only: no vLLM path"
    return True, ""


def check_rows(tree: SourceTree, version: str, rows=None) -> list[Result]:
    """One Result per declared row (the table of `version`'s glue, glues.table_for, unless rows
    are given) for vLLM `version`."""
    if rows is None:
        from vllm_sparrow.glues import table_for

        rows = table_for(version)
    resolver, build = Resolver(tree), tree.build()
    out = []
    for row in rows:
        check = "replaces" if row.kind == "replaces" else row.check
        by = row.name if row.kind == "replaces" else row.by
        applies, why = row_applies(row, version)
        if not applies:
            out.append(Result(row.kind, row.target, "skipped", why, by))
            continue
        found, detail = check_target(resolver, row.target, check, getattr(row, "params", None) or ())
        if row.platform not in ("any", build):
            # Another build's row (not applied on this one): its source may be here anyway (the GPU
            # wheel ships the CPU platform's modules), so it is checked where it is.
            out.append(Result(row.kind, row.target, "found", f"{row.platform} row, in this {build} build's "
                              "source too", by) if found else
                       Result(row.kind, row.target, "skipped", f"{row.platform} row, not in this {build} "
                              f"build's source ({detail}); checked on a {row.platform} build", by))
            continue
        if row.platform != "any":
            detail = "; ".join(filter(None, [f"{row.platform} row, this is a {build} build", detail]))
        out.append(Result(row.kind, row.target, "found" if found else "MISSING", detail, by))
    return out


# ---- the product's imports of vLLM ----------------------------------------------------------------
def product_imports(package: Path = ROOT / "vllm_sparrow") -> list[tuple[str, str, str]]:
    """(importing file, module, name or "") of every `import vllm...` and `from vllm... import
    name` in the package, module level or inside functions (lazy imports)."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package.parent))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Import):
                out += [(rel, a.name, "") for a in node.names if _is_vllm(a.name)]
            elif isinstance(node, ast.ImportFrom) and not node.level and _is_vllm(node.module or ""):
                out += [(rel, node.module, a.name) for a in node.names]
    return out


def _is_vllm(module: str) -> bool:
    return module == "vllm" or module.startswith("vllm.")


def imports_for(version: str) -> list[tuple[str, str, str]]:
    """product_imports() of the shared modules and of `version`'s glue (glues.glue_of): the V1
    runner's glue imports what the V2 runner's releases removed, the V2 runner's what the V1
    runner's never had. `version`: a release of releases.py."""
    from vllm_sparrow.glues import glue_of
    from vllm_sparrow.releases import release

    row = release(version)
    if row is None:  # a release the table does not list: every import, whichever glue it serves
        return product_imports()
    return [i for i in product_imports() if glue_of(i[0]) in (None, row.runner)]


def check_imports(tree: SourceTree, imports=None) -> list[Result]:
    resolver = Resolver(tree)
    out = []
    if imports is None:
        version = tree.version()
        imports = imports_for(version) if version else product_imports()
    for rel, module, name in sorted(set(imports)):
        shown = f"from {module} import {name}" if name else f"import {module}"
        if tree.module_file(module) is None:
            out.append(Result("import", shown, "MISSING", f"no module {module}", rel))
        elif name and resolver.module_name(module, name) is None:
            out.append(Result("import", shown, "MISSING", f"{module} has no {name}", rel))
        else:
            out.append(Result("import", shown, "found", "", rel))
    return out


# ---- where a wheel comes from -----------------------------------------------------------------------
def wheel_for(version: str, cache: Path = WHEEL_CACHE) -> Path:
    """vLLM's GPU wheel of `version` (a version, or a requirement "vllm==X.Y.Z"), downloaded once
    without dependencies into `cache`."""
    version = version.split("==", 1)[-1]
    cached = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if cached:
        return cached[0]
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"vllm=={version}",
                    "-d", str(cache)], check=True)
    cached = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not cached:
        raise FileNotFoundError(f"pip downloaded no vllm-{version} wheel into {cache}")
    return cached[0]


def release_source(version: str) -> Path:
    """The source release `version` of releases.py is checked against: the installed vLLM where it
    is that release, else the GPU wheel its row names."""
    from vllm_sparrow.releases import release, wheel_version

    row = release(version)
    if row is None:
        raise ValueError(f"vLLM {version} is not in vllm_sparrow/releases.py")
    try:
        installed = installed_source()
    except ModuleNotFoundError:
        installed = None
    if installed is not None and SourceTree(installed).version() == wheel_version(row):
        return installed
    return wheel_for(row.wheel)


def installed_source() -> Path:
    """The folder of the installed vllm package (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("no vllm is installed in this environment")
    return Path(next(iter(spec.submodule_search_locations)))


def check_all(tree: SourceTree, version: str | None = None) -> list[Result]:
    version = version or tree.version()
    if version is None:
        raise ValueError(f"cannot read vLLM's version from {tree.where}; pass --vllm-version")
    return check_rows(tree, version) + check_imports(tree, imports_for(version))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--wheel", help="a vLLM wheel, or a version whose GPU wheel is downloaded (no deps)")
    where.add_argument("--release", help="a release of vllm_sparrow/releases.py: the installed vLLM where it is "
                                         "that release, else the wheel its row names; 'all': each in turn")
    where.add_argument("--source", help="a folder holding the vllm package (or the package folder)")
    where.add_argument("--installed", action="store_true", help="the installed vLLM's source")
    parser.add_argument("--vllm-version", help="the version whose rows apply (default: read from the source)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # the rows and releases are the package's, from this checkout
    if args.release:
        from vllm_sparrow.releases import versions

        asked = versions() if args.release == "all" else (args.release,)
        return max(_report(SourceTree(release_source(v)), v) for v in asked)
    if args.wheel:
        path = Path(args.wheel) if args.wheel.endswith(".whl") else wheel_for(args.wheel)
    else:
        path = installed_source() if args.installed else Path(args.source)
    tree = SourceTree(path)
    return _report(tree, args.vllm_version or tree.version())


def _report(tree: SourceTree, version: str) -> int:
    path = tree.where
    results = check_all(tree, version)
    for r in results:
        print(r.line())
    missing = [r for r in results if r.status == "MISSING"]
    counts = {s: sum(r.status == s for r in results) for s in ("found", "MISSING", "skipped")}
    print(f"vLLM {version} ({path.name}): {counts['found']} found, {counts['MISSING']} missing, "
          f"{counts['skipped']} skipped")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
