"""Dependencies point one way: between the product's packages, and inside ``service/``.

The layers are those of ``docs/architecture.md`` ("Components and their owners"):
``functions`` (the worker, Lambda-packable) at the bottom, then ``drift`` and
``configurator``, then ``retrain``, then ``service``; the tooling (``benchmarks``,
``deploy``) sits beside or above and the product never imports it. Inside ``service/``
each part has a rank and imports only parts ranked below it, and the module graph has no
cycle, so every component can be constructed from what sits below it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Top-level package -> the packages it may import.
PACKAGES = {
    "functions": set(),
    "drift": set(),
    "configurator": {"functions"},
    "retrain": {"functions", "drift", "configurator"},
    "service": {"functions", "drift", "configurator", "retrain"},
    "deploy": {"functions"},
}

#: Parts of ``service/`` by rank: a part imports only parts of a lower rank.
SERVICE_RANKS = {
    "service.settings": 0,
    "service.background": 0,
    "service.collector": 0,
    "service.metrics": 1,
    "service.store": 1,
    "service.livefeed": 1,
    "service.auth": 2,
    "service.alerting": 2,
    "service.serving": 2,
    "service.ingest": 2,
    "service.cluster": 2,
    "service.retraining": 3,
    "service.stream": 3,
    "service.rollout": 4,
    "service.reads": 5,
    "service.dashboard": 6,
    "service.api": 7,
    "service.wiring": 8,
    "service.app": 9,
    "service.keys_cli": 9,
    "service.cli": 10,
    "service.__main__": 11,
}

#: Modules that stand for a runtime: the configurator plans for every runtime, so it
#: must not depend on any of them.
RUNTIMES = "functions.runtimes"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, *, at_import_only: bool = False) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved).

    ``at_import_only``: just those its import runs, not those inside functions or under
    ``if TYPE_CHECKING`` (the ones that can make an import cycle fail).
    """
    found: set[str] = set()
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = _run_at_import(tree.body) if at_import_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _run_at_import(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of ``body`` that run when the module is imported, flattened."""
    found: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.extend(_run_at_import(node.orelse))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, block, []):
                    inner = child.body if isinstance(child, ast.ExceptHandler) else [child]
                    found.extend(_run_at_import(inner))
        else:
            found.append(node)
    return found


def _sources(package: str) -> list[Path]:
    return [
        path
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts and "__pycache__" not in path.parts
    ]


def _part(module: str) -> str | None:
    """The ``SERVICE_RANKS`` key ``module`` belongs to (None: not in ``service``)."""
    parts = module.split(".")
    for length in (2, 1):
        key = ".".join(parts[:length])
        if key in SERVICE_RANKS:
            return key
    return None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_packages_import_only_the_layers_below(package: str) -> None:
    allowed = PACKAGES[package] | {package}
    product = set(PACKAGES) | {"benchmarks"}
    problems = [
        f"{_module_name(path)} imports {module}"
        for path in _sources(package)
        for module in sorted(_imports(path))
        if module.split(".")[0] in product and module.split(".")[0] not in allowed
    ]
    assert not problems, "\n".join(problems)


def test_the_configurator_imports_no_runtime() -> None:
    problems = [
        f"{_module_name(path)} imports {module}"
        for path in _sources("configurator")
        for module in sorted(_imports(path))
        if module == RUNTIMES or module.startswith(RUNTIMES + ".")
    ]
    assert not problems, "\n".join(problems)


def test_every_service_module_has_a_rank() -> None:
    unranked = [
        _module_name(path)
        for path in _sources("service")
        if _module_name(path) != "service" and _part(_module_name(path)) is None
    ]
    assert not unranked, f"add these to SERVICE_RANKS: {unranked}"


def test_no_import_inside_service_runs_back_up() -> None:
    problems = []
    for path in _sources("service"):
        importer = _part(_module_name(path))
        if importer is None:
            continue
        for module in sorted(_imports(path)):
            imported = _part(module)
            if imported is None or imported == importer:
                continue
            if SERVICE_RANKS[imported] >= SERVICE_RANKS[importer]:
                problems.append(f"{_module_name(path)} ({importer}) imports {module}")
    assert not problems, "\n".join(problems)


def test_the_module_graph_has_no_cycle() -> None:
    modules = {_module_name(path): path for package in PACKAGES for path in _sources(package)}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        imported = _imports(path, at_import_only=True)
        graph[name] = {m for m in imported if m in modules and m != name}
        # ``from package import x`` names the package's __init__, which may itself
        # import the module that imports it: only submodules count as edges there.
        graph[name] -= {m for m in graph[name] if name.startswith(m + ".")}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, trail: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
                return True
            if state.get(nxt) is None and visit(nxt, [*trail, nxt]):
                return True
        state[node] = 2
        return False

    for start in sorted(graph):
        if state.get(start) is None and visit(start, [start]):
            break
    assert not cycle, " -> ".join(cycle)
