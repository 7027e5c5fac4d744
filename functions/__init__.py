"""Model math, artifacts, the object store, the worker handler and its runtimes.

Everything here imports only numpy, the standard library and boto3 (for ``s3://``
stores), never `service`, `retrain` or `configurator`, so the package zips into a Lambda
deployment (``driftline package-function``).
"""

from functions.artifacts import (
    ArtifactError,
    dump_arrays,
    load_arrays,
    load_verified,
    model_from_bytes,
    model_to_bytes,
    sha256_hex,
)
from functions.mf import BiasedMF, top_k
from functions.objectstore import (
    FileObjectStore,
    ObjectNotFound,
    ObjectStore,
    model_key,
    open_object_store,
    register_object_store,
    validate_key,
)

__all__ = [
    "ArtifactError",
    "BiasedMF",
    "FileObjectStore",
    "ObjectNotFound",
    "ObjectStore",
    "dump_arrays",
    "load_arrays",
    "load_verified",
    "model_from_bytes",
    "model_key",
    "model_to_bytes",
    "open_object_store",
    "register_object_store",
    "sha256_hex",
    "top_k",
    "validate_key",
]
