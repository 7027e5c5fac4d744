"""The AWS Lambda deployment package of the retraining worker.

``driftline package-function`` zips the modules of the ``functions/`` package that the
worker imports, found by following ``functions.*`` imports (module-level and lazy ones)
from ``functions/handler.py`` and the package's ``__init__``: no runtimes (they invoke
the worker, they are not part of it), no torch worker, no tests. A top-level
``lambda_function.py`` exposes :func:`functions.handler.handler`, so the function's
handler setting is ``lambda_function.handler``.

The zip is deterministic: entries are sorted, every entry has the same timestamp
(1980-01-01, the earliest a zip can hold), permissions and compression level, so the same
source gives the same bytes and the same SHA-256 (with the same zlib), and a deployment
can be checked against a build.

numpy is not in the zip. The Lambda Python runtime includes boto3 but not numpy, so the
function needs a layer that provides it, e.g. AWS's managed "AWS SDK for pandas" layer
(``AWSSDKPandas-Python311``, which ships numpy), or a layer built from a numpy wheel for
the function's architecture (``manylinux2014_x86_64`` or ``_aarch64``, cp311).
"""

from __future__ import annotations

import ast
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import functions

__all__ = [
    "DEFAULT_OUTPUT",
    "HANDLER",
    "PackageInfo",
    "build_worker_zip",
    "worker_zip_bytes",
    "worker_zip_entries",
]

#: Where ``driftline package-function`` writes the zip unless told otherwise.
DEFAULT_OUTPUT = Path("dist/driftline-worker.zip")

#: The Lambda handler setting for the package.
HANDLER = "lambda_function.handler"

LAMBDA_FUNCTION_SOURCE = '''\
"""AWS Lambda entry point of the Driftline retraining worker.

Set the function's handler to ``lambda_function.handler``; the function needs numpy
from a layer (see ``deploy/packaging.py`` in the Driftline repository).
"""

from functions.handler import handler

__all__ = ["handler"]
'''

_TIMESTAMP = (1980, 1, 1, 0, 0, 0)
_FILE_MODE = 0o100644  # a regular file, rw-r--r--
_COMPRESS_LEVEL = 9


@dataclass(frozen=True)
class PackageInfo:
    """A built package: where it is, its size, checksum and entries."""

    path: Path
    size: int
    sha256: str
    entries: tuple[str, ...]
    handler: str = HANDLER


#: Non-code files, each with the module that reads it: shipped when that module is.
_DATA_FILES = {"prices.json": "pricing.py"}


def _is_packaged(relative: Path) -> bool:
    parts = relative.parts
    if "__pycache__" in parts:
        return False
    if relative.suffix != ".py":
        return relative.as_posix() in _DATA_FILES
    if any(part in ("tests", "test") for part in parts[:-1]):
        return False
    name = parts[-1]
    return not (name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py")


def worker_modules(root: Path) -> set[Path]:
    """The package's source files the worker imports, relative to ``root``.

    Follows ``import functions.x`` and ``from functions.x import ...`` statements
    anywhere in a module (lazy imports inside functions included), starting from the
    handler and the package's ``__init__``.
    """
    package = root.name
    if not (root / "handler.py").is_file():
        raise FileNotFoundError(f"{root} has no handler.py; is it the functions package?")
    found: set[Path] = set()
    pending = [Path("__init__.py"), Path("handler.py")]
    while pending:
        module = pending.pop()
        if module in found or not (root / module).is_file():
            continue
        found.add(module)
        for name in _imported(root / module, package):
            parts = name.split(".")[1:]
            candidates = [Path(*parts).with_suffix(".py"), Path(*parts, "__init__.py")]
            if parts[:-1]:
                candidates.append(Path(*parts[:-1], "__init__.py"))  # a package's own init
            pending.extend(c for c in candidates if parts)
    return found


def _imported(path: Path, package: str) -> set[str]:
    """Dotted names of ``package`` modules that ``path`` imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == package:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == package)
    return names


def worker_zip_entries(package_dir: Path | None = None) -> dict[str, bytes]:
    """Archive name → bytes of every entry of the package, in archive order."""
    root = Path(functions.__file__).parent if package_dir is None else Path(package_dir)
    modules = worker_modules(root)
    entries: dict[str, bytes] = {}
    for relative in sorted(modules):
        if _is_packaged(relative):
            entries[f"{root.name}/{relative.as_posix()}"] = (root / relative).read_bytes()
    for data_file, reader in _DATA_FILES.items():
        if Path(reader) in modules:
            entries[f"{root.name}/{data_file}"] = (root / data_file).read_bytes()
    entries["lambda_function.py"] = LAMBDA_FUNCTION_SOURCE.encode()
    return {name: entries[name] for name in sorted(entries)}


def worker_zip_bytes(package_dir: Path | None = None) -> bytes:
    """The deployment zip, as bytes; identical for identical sources."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in worker_zip_entries(package_dir).items():
            info = zipfile.ZipInfo(name, date_time=_TIMESTAMP)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # Unix, so that external_attr holds the file mode
            info.external_attr = _FILE_MODE << 16
            archive.writestr(info, data, compresslevel=_COMPRESS_LEVEL)
    return buffer.getvalue()


def build_worker_zip(output: Path | str = DEFAULT_OUTPUT) -> PackageInfo:
    """Write the deployment zip to `output` (parents created) and describe it."""
    data = worker_zip_bytes()
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = tuple(archive.namelist())
    return PackageInfo(
        path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest(), entries=names
    )


@dataclass(frozen=True)
class DeploySpec:
    """How the worker function is configured on AWS Lambda."""

    name: str = "driftline-worker"
    role_arn: str | None = None
    memory_mb: int = 1769
    timeout_s: int = 900
    layers: tuple[str, ...] = ()
    runtime: str = "python3.11"

    def __post_init__(self) -> None:
        if not 128 <= self.memory_mb <= 10_240:
            raise ValueError(f"memory_mb must be within 128..10240, got {self.memory_mb}")
        if not 1 <= self.timeout_s <= 900:
            raise ValueError(f"timeout_s must be within 1..900, got {self.timeout_s}")


def deploy_worker(client: Any, spec: DeploySpec, code: bytes | None = None) -> dict[str, Any]:
    """Create the worker function, or update its code and configuration; returns its
    configuration as Lambda reports it.

    Creating needs ``spec.role_arn`` (the execution role); updating keeps the role.
    """
    code = worker_zip_bytes() if code is None else code
    settings = {
        "MemorySize": spec.memory_mb,
        "Timeout": spec.timeout_s,
        "Layers": list(spec.layers),
    }
    try:
        client.get_function(FunctionName=spec.name)
    except client.exceptions.ResourceNotFoundException:
        if not spec.role_arn:
            raise ValueError(
                f"function {spec.name!r} does not exist yet; creating it needs --role"
            ) from None
        return client.create_function(
            FunctionName=spec.name,
            Runtime=spec.runtime,
            Role=spec.role_arn,
            Handler=HANDLER,
            Code={"ZipFile": code},
            **settings,
        )
    client.update_function_code(FunctionName=spec.name, ZipFile=code)
    client.get_waiter("function_updated").wait(FunctionName=spec.name)
    return client.update_function_configuration(FunctionName=spec.name, **settings)
