"""Artifacts: npz round trips, checksums and rejection of damaged or unsafe bytes."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from functions.artifacts import (
    ArtifactError,
    dump_arrays,
    load_arrays,
    load_verified,
    model_from_bytes,
    model_to_bytes,
    pack_arrays,
    sha256_hex,
)
from functions.mf import BiasedMF

ARRAYS = {
    "weights": np.arange(12, dtype=np.float64).reshape(3, 4),
    "ids": np.array(["a", "bé", "c"]),
    "scalar": np.array(0.25),
}


def trained_model() -> BiasedMF:
    model = BiasedMF(factors=4, seed=0)
    model.fit(["a", "b", "c", "a"], ["x", "y", "x", "z"], [4.0, 3.0, 5.0, 2.0], epochs=3)
    return model


def test_arrays_round_trip_exactly() -> None:
    loaded = load_arrays(dump_arrays(ARRAYS))
    assert loaded.keys() == ARRAYS.keys()
    for name, value in ARRAYS.items():
        np.testing.assert_array_equal(loaded[name], value)
        assert loaded[name].dtype == value.dtype and loaded[name].shape == value.shape


def test_dump_is_deterministic_and_npz_compatible() -> None:
    data = dump_arrays(ARRAYS)
    assert dump_arrays(dict(reversed(ARRAYS.items()))) == data
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        np.testing.assert_array_equal(npz["weights"], ARRAYS["weights"])


def test_savez_output_is_readable() -> None:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=np.ones(3))
    np.testing.assert_array_equal(load_arrays(buffer.getvalue())["x"], np.ones(3))


def test_object_arrays_are_refused_both_ways() -> None:
    with pytest.raises(ArtifactError, match="object dtype"):
        dump_arrays({"bad": np.array([{"a": 1}], dtype=object)})
    buffer = io.BytesIO()
    np.savez(buffer, bad=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ArtifactError, match="not a readable"):
        load_arrays(buffer.getvalue())


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not an archive at all",
        pickle.dumps({"weights": [1, 2, 3]}),
        dump_arrays(ARRAYS)[:-40],
        dump_arrays(ARRAYS)[: len(dump_arrays(ARRAYS)) // 2],
    ],
    ids=["empty", "garbage", "pickle", "truncated-tail", "truncated-half"],
)
def test_damaged_bytes_raise_artifact_error(data: bytes) -> None:
    with pytest.raises(ArtifactError):
        load_arrays(data)


NUMBERS = {
    "weights": np.arange(12, dtype=np.float64).reshape(3, 4)[::-1],  # not contiguous
    "rows": np.array([], dtype=np.int64),
    "scalar": np.array(0.25),
    "big_endian": np.arange(5, dtype=">i4"),
    "flags": np.array([True, False]),
    "ids": np.array(["a", "bé", "c"]),
}


def test_packed_arrays_round_trip_exactly_and_writable() -> None:
    data = pack_arrays(NUMBERS)
    assert pack_arrays(dict(reversed(NUMBERS.items()))) == data  # deterministic
    loaded = load_arrays(data)
    assert loaded.keys() == NUMBERS.keys()
    for name, value in NUMBERS.items():
        np.testing.assert_array_equal(loaded[name], value)
        assert loaded[name].dtype == value.dtype.newbyteorder("=")  # read in native order
        assert loaded[name].shape == value.shape
        assert loaded[name].flags.writeable  # a snapshot is trained in place
    assert load_verified(data, sha256_hex(data)).keys() == NUMBERS.keys()


def test_packing_refuses_what_is_not_a_number() -> None:
    with pytest.raises(ArtifactError, match="only numbers and strings pack"):
        pack_arrays({"when": np.array(["2026-11-22"], dtype="datetime64[D]")})
    with pytest.raises(ArtifactError, match="only numbers and strings pack"):
        pack_arrays({"bad": np.array([{"a": 1}], dtype=object)})


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda d: d[:10], "truncated in their header"),
        (lambda d: d[:-8], "runs past the end"),
        (lambda d: d + b"\0", "trailing bytes"),
        (lambda d: d[:12] + b"{not json" + d[21:], "malformed"),
        (lambda d: d.replace(b"<f8", b"|O8", 1), "malformed"),
    ],
    ids=["header", "tail", "trailing", "json", "object-dtype"],
)
def test_damaged_packed_arrays_raise_artifact_error(damage, named: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ArtifactError, match=named):
        load_arrays(damage(pack_arrays(NUMBERS)))


def test_bare_npy_is_not_an_artifact() -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.ones(3))
    with pytest.raises(ArtifactError, match="single array"):
        load_arrays(buffer.getvalue())


def test_checksum_mismatch_names_both_checksums() -> None:
    data = dump_arrays(ARRAYS)
    good = sha256_hex(data)
    assert load_verified(data, good.upper())["ids"].tolist() == ["a", "bé", "c"]

    tampered = bytearray(data)
    tampered[len(tampered) // 2] ^= 0xFF
    with pytest.raises(ArtifactError) as caught:
        load_verified(bytes(tampered), good)
    assert good in str(caught.value) and sha256_hex(bytes(tampered)) in str(caught.value)
    with pytest.raises(ArtifactError, match="mismatch"):
        load_verified(data, "0" * 64)


def test_artifact_error_is_a_value_error() -> None:
    assert issubclass(ArtifactError, ValueError)


def test_model_bytes_round_trip() -> None:
    model = trained_model()
    data = model_to_bytes(model)
    restored = model_from_bytes(data, expected_sha256=sha256_hex(data))
    users, items = ["a", "b", "c", "q"], ["x", "z", "nope", "y"]
    np.testing.assert_array_equal(restored.predict(users, items), model.predict(users, items))
    assert model_from_bytes(data).get_params() == model.get_params()


def test_model_from_bytes_rejects_tampering_and_foreign_arrays() -> None:
    data = model_to_bytes(trained_model())
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        model_from_bytes(data + b"\x00", expected_sha256=sha256_hex(data))
    with pytest.raises(ArtifactError, match="BiasedMF"):
        model_from_bytes(dump_arrays(ARRAYS))
    with pytest.raises(ArtifactError):
        model_from_bytes(data[:100])
