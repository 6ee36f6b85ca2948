"""The shape of the package, checked statically with ``ast``: mmaemit modules talk through public names and import
each other without loops (developers' guide: "One concept per module; modules talk through public names. No module
imports another module's ``_private`` names, and no import loops").

* Import graph: one node per module of ``mmaemit/`` (a package is its ``__init__``); an edge for every ``import`` /
  ``from ... import`` anywhere in the module (module level and inside functions alike: a lazy import is still a
  dependency). ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``. Importing
  a submodule does not count as importing its parent packages (Python runs their ``__init__`` first, but a package
  importing its own submodules is not a loop). The graph must be acyclic.
* Private names: ``from X import _name`` from another mmaemit module, ``module._name`` on an imported mmaemit
  module, and ``obj._name`` where ``_name`` is a private attribute that only other mmaemit modules define (a method
  or attribute of another module's class reached through an instance) are all refused. A package-private module
  (``pkg/_x.py``) may be imported by its own package.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "mmaemit"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict:
    """module name -> (path, ast tree, is_package)"""
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        out[_module_name(p)] = (p, ast.parse(p.read_text(), str(p)), p.name == "__init__.py")
    return out


MODULES = _modules()


def _resolve(mod: str, is_pkg: bool, level: int, target: str | None) -> str:
    """Absolute module name of a (possibly relative) import in module ``mod``."""
    if level == 0:
        return target or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imports(mod: str):
    """[(line, imported module, imported name or None)] of every import statement in ``mod``."""
    _path, tree, is_pkg = MODULES[mod]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((node.lineno, a.name, None, a.asname or a.name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(mod, is_pkg, node.level, node.module)
            for a in node.names:
                out.append((node.lineno, src, a.name, a.asname or a.name))
    return out


def _edges() -> dict:
    graph = {m: set() for m in MODULES}
    for mod in MODULES:
        for _line, src, name, _bound in _imports(mod):
            if not src.startswith("mmaemit"):
                continue
            target = src
            if name is not None and f"{src}.{name}" in MODULES:
                target = f"{src}.{name}"
            if target in MODULES and target != mod:
                graph[mod].add(target)
    return graph


def _cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _defined_privates(mod: str) -> set:
    """Private names a module defines: top-level and class-level defs/assignments, ``self._x`` attributes,
    ``__slots__`` entries, keyword/dataclass fields."""
    _path, tree, _pkg = MODULES[mod]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id == "__slots__" and isinstance(node.value, (ast.Tuple, ast.List)):
                    names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if _is_private(n)}


def _private_uses() -> list:
    defined = {m: _defined_privates(m) for m in MODULES}
    anywhere = {}
    for m, names in defined.items():
        for n in names:
            anywhere.setdefault(n, set()).add(m)
    bad = []
    for mod in MODULES:
        path, tree, is_pkg = MODULES[mod]
        pkg = mod if is_pkg else mod.rpartition(".")[0]
        module_aliases = {}
        for line, src, name, bound in _imports(mod):
            if not src.startswith("mmaemit"):
                continue
            full = f"{src}.{name}" if name is not None else src
            if name is None:
                module_aliases[bound] = src
            elif full in MODULES:
                module_aliases[bound] = full
            if name is not None and _is_private(name):
                own_private_module = full in MODULES and src == pkg
                if not own_private_module:
                    bad.append(f"{path.relative_to(ROOT.parent)}:{line}: from {src} import {name}")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            v = node.value
            if isinstance(v, ast.Name) and v.id in module_aliases:
                target = module_aliases[v.id]
                if target != mod:
                    bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {v.id}.{node.attr} "
                               f"(private name of {target})")
                continue
            if isinstance(v, ast.Name) and v.id in ("self", "cls"):
                continue
            if node.attr in defined[mod]:
                continue
            owners = anywhere.get(node.attr, set()) - {mod}
            if owners:
                bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: .{node.attr} (private attribute "
                           f"defined in {', '.join(sorted(owners))})")
    return bad


def test_every_module_parses():
    assert "mmaemit" in MODULES and len(MODULES) > 20


def test_no_import_cycles():
    cycles = _cycles(_edges())
    assert not cycles, "import cycles among mmaemit modules:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_private_names_across_modules():
    bad = _private_uses()
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def test_checker_sees_loops_and_private_names():
    """The checker itself can fail: a loop through a function-level import, a private import, a private module
    attribute and a private method of another module's class reached through an instance."""
    a = ast.parse("from . import c\n\ndef f(obj):\n    from .b import g\n    return g(obj) + c._secret + obj._helper()\n")
    b = ast.parse("from .a import _hidden\n\ndef g(obj):\n    return 1\n")
    c = ast.parse("_secret = 1\n\nclass K:\n    def _helper(self):\n        return 2\n")
    fake = {"mmaemit": (ROOT / "__init__.py", ast.parse(""), True), "mmaemit.a": (ROOT / "a.py", a, False),
            "mmaemit.b": (ROOT / "b.py", b, False), "mmaemit.c": (ROOT / "c.py", c, False)}
    saved = dict(MODULES)
    MODULES.clear()
    MODULES.update(fake)
    try:
        assert _cycles(_edges()) == [["mmaemit.a", "mmaemit.b"]]
        bad = _private_uses()
        assert any("import _hidden" in x for x in bad)
        assert any("c._secret" in x for x in bad)
        assert any("._helper" in x and "mmaemit.c" in x for x in bad)
        assert len(bad) == 3, bad
    finally:
        MODULES.clear()
        MODULES.update(saved)
