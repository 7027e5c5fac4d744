"""``functions/`` must zip into a Lambda package: numpy, boto3 and the standard library only.

That also keeps it from importing ``service``, ``retrain``, ``configurator`` or ``drift``,
so the dependency arrows point one way (``docs/architecture.md``, "Components and their
owners").
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import functions

PACKAGE = Path(functions.__file__).parent
THIRD_PARTY = {"numpy", "boto3", "botocore"}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_functions_imports_only_numpy_boto3_and_stdlib() -> None:
    problems: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        allowed = THIRD_PARTY | set(sys.stdlib_module_names) | {"functions", "__future__"}
        if "gpu" in path.stem or "torch" in path.stem:  # the GPU worker may use torch
            allowed |= {"torch"}
        if path == PACKAGE / "runtimes" / "ray.py":  # invokes workers, not in the zip
            allowed |= {"ray"}
        bad = imported_roots(path) - allowed
        if bad:
            problems.append(f"{path.relative_to(PACKAGE.parent)} imports {sorted(bad)}")
    assert not problems, "functions/ must stay Lambda-packable:\n" + "\n".join(problems)
