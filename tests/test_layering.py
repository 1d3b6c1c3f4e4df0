"""The house rules of DESIGN.md §4, checked on the source: bands, no cycles, small classes.

Every ``import`` in ``src/jigsawrl`` — module level or inside a function — is an edge from the
importing module to the imported one. The rules:

- the package root holds at most five modules besides ``__init__.py`` (the vocabulary);
- each top-level unit (a subpackage or a root module) has a rank (:data:`LAYERS`) and imports only
  units of a lower rank, or itself: the vocabulary first, then band 1 (the pure model) in the order
  of DESIGN.md §4, band 2 (the runtimes), band 3 (the applications);
- no cycle between modules, function-local imports included;
- no class over 300 lines;
- no private name (``_x``) imported from another module.

It reads the files as text (``ast``), so it runs without torch or ray.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "jigsawrl"
PKG = "jigsawrl"

# Rank of each top-level unit: a unit may import units of a strictly lower rank (and itself).
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("stages",),
    ("config",),
    ("events",),
    # band 1 — the pure model (no torch, no ray), in DESIGN.md §4's order
    ("workload",),
    ("costmodel",),
    ("sim",),
    ("graph",),
    ("scheduler",),
    ("driver",),
    ("metrics",),
    # band 2 — runtimes (tasks are pure Python; the engine uses them; executors run both)
    ("tasks",),
    ("engine",),
    ("executors",),
    # band 3 — applications
    ("experiments",),
    ("bench",),
    ("cli",),
]
RANK = {unit: i for i, group in enumerate(LAYERS) for unit in group}
MAX_ROOT_MODULES = 5
MAX_CLASS_LINES = 300


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


MODS = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODS:
        name = name.rpartition(".")[0]
    return name or None


def _imports(mod: str, path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(imported module, names taken from it) for every import statement of ``mod``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name)
                if target and target.startswith(PKG):
                    out.append((target, ()))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if not base.startswith(PKG):
                continue
            for alias in node.names:
                sub = _resolve(f"{base}.{alias.name}")
                if sub is not None and sub == f"{base}.{alias.name}":
                    out.append((sub, ()))  # a submodule imported by name
                else:
                    target = _resolve(base)
                    if target:
                        out.append((target, (alias.name,)))
    return out


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in MODS.items():
        for target, _names in _imports(mod, path):
            # a package's __init__ re-exporting its own modules is not a dependency of theirs
            if target != mod and not (MODS[target].name == "__init__.py"
                                      and mod.startswith(target + ".")):
                edges[mod].add(target)
    return edges


def _unit(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(MODS):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_every_unit_has_a_band() -> None:
    units = {_unit(m) for m in MODS if m != PKG}
    missing = sorted(units - set(RANK))
    assert not missing, f"top-level units without a band in LAYERS: {missing}"


def test_root_holds_only_the_vocabulary() -> None:
    root = sorted(p.stem for p in SRC.glob("*.py") if p.name != "__init__.py")
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at the package root: {root}"


def test_each_band_imports_only_from_those_before_it() -> None:
    bad = []
    for mod, targets in _edges().items():
        if mod == PKG:
            continue
        src = _unit(mod)
        for target in targets:
            dst = _unit(target)
            if target == PKG or dst == src:
                continue
            if RANK.get(dst, -1) >= RANK.get(src, -1):
                bad.append(f"{mod} -> {target}")
    assert not bad, "imports against the layering of DESIGN.md §4:\n  " + "\n  ".join(sorted(bad))


def test_no_import_cycles() -> None:
    cycles = _cycles(_edges())
    assert not cycles, "import cycles:\n  " + "\n  ".join(" <-> ".join(c) for c in cycles)


def test_no_private_names_imported_across_modules() -> None:
    bad = []
    for mod, path in MODS.items():
        for target, names in _imports(mod, path):
            bad += [f"{mod}: {target}.{n}" for n in names
                    if n.startswith("_") and not n.startswith("__") and target != mod]
    assert not bad, "private names imported from another module:\n  " + "\n  ".join(sorted(bad))


def test_no_class_over_300_lines() -> None:
    big = []
    for mod, path in MODS.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    big.append(f"{mod}.{node.name}: {lines} lines")
    assert not big, "classes over 300 lines:\n  " + "\n  ".join(big)


@pytest.mark.parametrize("case", [
    ({"a.x": {"a.y"}, "a.y": {"a.x"}}, 1),
    ({"a.x": {"a.y"}, "a.y": set()}, 0),
])
def test_the_cycle_finder_finds_cycles(case: tuple[dict[str, set[str]], int],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself can fail: a two-module cycle is found, a chain is not."""
    edges, want = case
    monkeypatch.setattr(__import__(__name__, fromlist=["MODS"]), "MODS",
                        {m: Path(m) for m in edges})
    assert len(_cycles(edges)) == want
