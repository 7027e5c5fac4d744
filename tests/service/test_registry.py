"""The model registry (``service.serving.registry.ModelRegistry``) over SQLite and a file store."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.exc import IntegrityError

from functions.artifacts import ArtifactError
from functions.mf import BiasedMF
from functions.objectstore import FileObjectStore, model_key
from service.serving.registry import ModelRegistry
from service.store import Database
from service.store.jobs import create_job
from service.store.versions import add_version
from tests.support.synthetic import stationary_stream


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path}/x.db")
    yield database
    database.dispose()


@pytest.fixture
def store(tmp_path: Path) -> FileObjectStore:
    return FileObjectStore(tmp_path / "objects")


@pytest.fixture
def registry(db: Database, store: FileObjectStore) -> ModelRegistry:
    return ModelRegistry(db, store)


@pytest.fixture(scope="module")
def events() -> list[dict]:
    return stationary_stream(n_users=40, n_items=30, n_events=800, factors=3, seed=11)


def _model(events: list[dict], seed: int = 0) -> BiasedMF:
    model = BiasedMF(factors=4, seed=seed)
    model.fit(
        [e["user_id"] for e in events],
        [e["item_id"] for e in events],
        [e["rating"] for e in events],
        epochs=3,
        batch_size=128,
    )
    return model


def _pairs(events: list[dict]) -> tuple[list[str], list[str]]:
    users = [e["user_id"] for e in events] + ["stranger", "u0"]
    items = [e["item_id"] for e in events] + ["i0", "unseen-item"]
    return users, items


def _artifact_path(store: FileObjectStore, version: str) -> Path:
    (key,) = store.list(f"models/{version}/")
    return store.root.joinpath(*key.split("/"))


def test_publish_then_load_gives_identical_predictions(
    registry: ModelRegistry, events: list[dict]
) -> None:
    model = _model(events)
    published = registry.publish(model, last_event_id=800, job_id=None, rmse=0.91)
    loaded = registry.load(published.version)
    users, items = _pairs(events)
    np.testing.assert_array_equal(loaded.model.predict(users, items), model.predict(users, items))
    assert loaded.model.user_ids == model.user_ids
    assert loaded.model.item_ids == model.item_ids
    assert loaded.model.get_params() == model.get_params()
    assert loaded.version == published.version
    assert loaded.last_event_id == 800
    assert loaded.row["rmse"] == 0.91


def test_publish_records_the_models_size_and_event_boundary(
    registry: ModelRegistry, events: list[dict]
) -> None:
    model = _model(events)
    published = registry.publish(model, last_event_id=123, job_id=None, rmse=None)
    assert published.model is model
    (row,) = registry.versions()
    assert row["version"] == published.version
    assert (row["n_users"], row["n_items"]) == (model.n_users, model.n_items)
    assert row["last_event_id"] == 123
    assert row["rmse"] is None and row["job_id"] is None
    assert row["artifact_key"] == model_key(published.version, row["checksum"])


def test_version_names_increase(registry: ModelRegistry, events: list[dict]) -> None:
    names = [
        registry.publish(_model(events, seed=s), last_event_id=s, job_id=None, rmse=None).version
        for s in range(3)
    ]
    assert names == ["v0001", "v0002", "v0003"]
    assert [row["version"] for row in registry.versions()] == ["v0003", "v0002", "v0001"]


def test_the_recorded_checksum_is_the_sha256_of_the_stored_bytes(
    registry: ModelRegistry, store: FileObjectStore, events: list[dict]
) -> None:
    published = registry.publish(_model(events), last_event_id=1, job_id=None, rmse=None)
    (row,) = registry.versions()
    on_disk = _artifact_path(store, published.version).read_bytes()
    assert row["checksum"] == hashlib.sha256(on_disk).hexdigest()
    assert row["checksum"] == hashlib.sha256(store.get(row["artifact_key"])).hexdigest()


def test_loading_an_unknown_version_is_a_key_error(registry: ModelRegistry) -> None:
    with pytest.raises(KeyError):
        registry.load("v0042")


def test_an_empty_registry_has_nothing_loadable(registry: ModelRegistry) -> None:
    assert registry.versions() == []
    assert registry.newest_loadable() is None
    assert registry.oldest_loadable() is None


def test_newest_and_oldest_loadable_pick_the_ends(
    registry: ModelRegistry, events: list[dict]
) -> None:
    for seed in range(3):
        registry.publish(_model(events, seed=seed), last_event_id=seed, job_id=None, rmse=None)
    newest, oldest = registry.newest_loadable(), registry.oldest_loadable()
    assert newest is not None and oldest is not None
    assert (newest.version, oldest.version) == ("v0003", "v0001")


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    path.write_bytes(bytes(data))


def test_a_corrupted_artifact_is_refused(
    registry: ModelRegistry, store: FileObjectStore, events: list[dict]
) -> None:
    published = registry.publish(_model(events), last_event_id=1, job_id=None, rmse=None)
    _corrupt(_artifact_path(store, published.version))
    with pytest.raises(ArtifactError, match="checksum"):
        registry.load(published.version)


def test_a_truncated_artifact_is_refused(
    registry: ModelRegistry, store: FileObjectStore, events: list[dict]
) -> None:
    published = registry.publish(_model(events), last_event_id=1, job_id=None, rmse=None)
    path = _artifact_path(store, published.version)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ArtifactError):
        registry.load(published.version)


def test_newest_loadable_skips_a_corrupted_newest_version(
    registry: ModelRegistry, store: FileObjectStore, events: list[dict]
) -> None:
    older = _model(events, seed=1)
    registry.publish(older, last_event_id=1, job_id=None, rmse=None)
    newer = registry.publish(_model(events, seed=2), last_event_id=2, job_id=None, rmse=None)
    _corrupt(_artifact_path(store, newer.version))
    fallback = registry.newest_loadable()
    assert fallback is not None
    assert fallback.version == "v0001"
    assert fallback.last_event_id == 1
    users, items = _pairs(events)
    np.testing.assert_array_equal(fallback.model.predict(users, items), older.predict(users, items))


def test_a_missing_artifact_is_refused_and_skipped(
    registry: ModelRegistry, store: FileObjectStore, events: list[dict]
) -> None:
    registry.publish(_model(events, seed=1), last_event_id=1, job_id=None, rmse=None)
    newer = registry.publish(_model(events, seed=2), last_event_id=2, job_id=None, rmse=None)
    _artifact_path(store, newer.version).unlink()
    with pytest.raises(ArtifactError, match="missing"):
        registry.load(newer.version)
    fallback = registry.newest_loadable()
    assert fallback is not None and fallback.version == "v0001"


def test_oldest_loadable_skips_a_broken_oldest_version(
    registry: ModelRegistry, store: FileObjectStore, events: list[dict]
) -> None:
    first = registry.publish(_model(events, seed=1), last_event_id=1, job_id=None, rmse=None)
    registry.publish(_model(events, seed=2), last_event_id=2, job_id=None, rmse=None)
    _artifact_path(store, first.version).unlink()
    oldest = registry.oldest_loadable()
    assert oldest is not None and oldest.version == "v0002"


def test_nothing_is_loadable_when_every_artifact_is_broken(
    registry: ModelRegistry, store: FileObjectStore, events: list[dict]
) -> None:
    first = registry.publish(_model(events, seed=1), last_event_id=1, job_id=None, rmse=None)
    second = registry.publish(_model(events, seed=2), last_event_id=2, job_id=None, rmse=None)
    _corrupt(_artifact_path(store, first.version))
    _artifact_path(store, second.version).unlink()
    assert registry.newest_loadable() is None
    assert registry.oldest_loadable() is None


def test_a_second_registry_on_the_same_stores_sees_and_continues_the_versions(
    db: Database, store: FileObjectStore, registry: ModelRegistry, events: list[dict]
) -> None:
    registry.publish(_model(events, seed=1), last_event_id=1, job_id=None, rmse=None)
    other = ModelRegistry(db, FileObjectStore(store.root))
    assert other.publish(
        _model(events, seed=2), last_event_id=2, job_id=None, rmse=None
    ).version == ("v0002")
    newest = registry.newest_loadable()
    assert newest is not None and newest.version == "v0002"


class _RacingStore(FileObjectStore):
    """A file store in which another publisher registers a version during our first put.

    That is the interleaving of two processes publishing at once: both read the taken
    names before either registered, the other one finishes first, and then our write
    lands under the name it took.
    """

    def __init__(
        self, root: Path, rival: ModelRegistry, rival_model: BiasedMF, job_id: int | None = None
    ) -> None:
        super().__init__(root)
        self.rival = rival
        self.rival_model = rival_model
        self.job_id = job_id
        self.raced = False

    def put(self, key: str, data: bytes) -> None:
        if not self.raced:
            self.raced = True
            self.rival.publish(self.rival_model, last_event_id=1, job_id=self.job_id, rmse=None)
        super().put(key, data)


def test_a_publisher_losing_a_name_race_leaves_the_winners_version_intact(
    db: Database, tmp_path: Path, events: list[dict]
) -> None:
    root = tmp_path / "shared-objects"
    rival = ModelRegistry(db, FileObjectStore(root))
    ours = ModelRegistry(db, _RacingStore(root, rival, _model(events, seed=1)))
    published = ours.publish(_model(events, seed=2), last_event_id=2, job_id=None, rmse=None)
    assert published.version == "v0002"
    # The rival's v0001 must still load: its registered checksum must match its bytes.
    assert rival.load("v0001").version == "v0001"


def _job(db: Database) -> int:
    with db.begin() as conn:
        return create_job(conn, policy="adwin", trigger="manual", runtime="thread", params={})


def _stored_models(store: FileObjectStore) -> list[str]:
    return store.list("models/")


def test_a_job_publishes_one_version_however_often_it_publishes(
    db: Database, store: FileObjectStore, registry: ModelRegistry, events: list[dict]
) -> None:
    """A job resumed after a crash between publishing and recording publishes again: it
    gets the version it published first, not a second one."""
    job = _job(db)
    first = registry.publish(_model(events, seed=1), last_event_id=5, job_id=job, rmse=0.9)
    again = registry.publish(_model(events, seed=2), last_event_id=6, job_id=job, rmse=0.8)
    assert again.version == first.version == "v0001"
    assert again.last_event_id == 5
    users, items = _pairs(events)
    np.testing.assert_array_equal(
        again.model.predict(users, items), first.model.predict(users, items)
    )
    assert [row["job_id"] for row in registry.versions()] == [job]
    assert len(_stored_models(store)) == 1
    # Another job still gets a version of its own.
    other = registry.publish(_model(events, seed=3), last_event_id=7, job_id=_job(db), rmse=None)
    assert other.version == "v0002"


def test_a_job_id_registers_at_most_one_version_even_bypassing_the_lookup(
    db: Database, registry: ModelRegistry, events: list[dict]
) -> None:
    job = _job(db)
    registry.publish(_model(events), last_event_id=5, job_id=job, rmse=None)
    with pytest.raises(IntegrityError), db.begin() as conn:
        add_version(
            conn,
            version="v0099",
            artifact_key="models/v0099/x.npz",
            checksum="0" * 64,
            job_id=job,
            last_event_id=5,
            n_users=1,
            n_items=1,
        )


def test_two_processes_publishing_for_one_job_register_one_version_and_no_orphan(
    db: Database, tmp_path: Path, events: list[dict]
) -> None:
    root = tmp_path / "shared-objects"
    job = _job(db)
    rival = ModelRegistry(db, FileObjectStore(root))
    store = _RacingStore(root, rival, _model(events, seed=1), job_id=job)
    ours = ModelRegistry(db, store)
    published = ours.publish(_model(events, seed=2), last_event_id=2, job_id=job, rmse=None)
    assert published.version == "v0001"
    assert [row["job_id"] for row in ours.versions()] == [job]
    # Our artifact, registered under no name, is gone; the rival's loads.
    assert len(_stored_models(store)) == 1
    assert rival.load("v0001").model.get_params() == published.model.get_params()


def test_a_publisher_losing_a_name_race_deletes_its_unregistered_artifact(
    db: Database, tmp_path: Path, events: list[dict]
) -> None:
    root = tmp_path / "shared-objects"
    rival = ModelRegistry(db, FileObjectStore(root))
    store = _RacingStore(root, rival, _model(events, seed=1))
    ours = ModelRegistry(db, store)
    ours.publish(_model(events, seed=2), last_event_id=2, job_id=None, rmse=None)
    registered = sorted(row["artifact_key"] for row in ours.versions())
    assert sorted(_stored_models(store)) == registered


def _publish_many(registry: ModelRegistry, events: list[dict], n: int) -> list[str]:
    return [
        registry.publish(_model(events, seed=s), last_event_id=s, job_id=None, rmse=None).version
        for s in range(n)
    ]


def test_retention_deletes_artifacts_beyond_the_newest_but_keeps_protected_ones(
    store: FileObjectStore, registry: ModelRegistry, events: list[dict]
) -> None:
    names = _publish_many(registry, events, 6)  # v0001 … v0006
    deleted = registry.prune(2, protected={"v0001", "v0003"})
    assert sorted(deleted) == ["v0002", "v0004"]
    kept = {row["version"] for row in registry.versions(include_deleted=False)}
    assert kept == {"v0001", "v0003", "v0005", "v0006"}
    # The rows stay, marked, so the history still lists every version.
    rows = {row["version"]: row for row in registry.versions()}
    assert set(rows) == set(names)
    assert {v for v, row in rows.items() if row["deleted_at"] is not None} == set(deleted)
    assert sorted(_stored_models(store)) == sorted(rows[v]["artifact_key"] for v in kept)
    with pytest.raises(ArtifactError, match="deleted by retention"):
        registry.load("v0002")
    assert registry.prune(2, protected={"v0001", "v0003"}) == []


class _StuckStore(FileObjectStore):
    """A store whose deletes fail until told otherwise."""

    stuck = True

    def delete(self, key: str) -> None:
        if self.stuck:
            raise OSError("the store is unreachable")
        super().delete(key)


def test_a_failed_retention_delete_keeps_the_row_live_and_is_retried(
    db: Database, tmp_path: Path, events: list[dict]
) -> None:
    store = _StuckStore(tmp_path / "stuck")
    registry = ModelRegistry(db, store)
    _publish_many(registry, events, 3)
    assert registry.prune(1, protected=set()) == []
    assert all(row["deleted_at"] is None for row in registry.versions())
    store.stuck = False
    assert sorted(registry.prune(1, protected=set())) == ["v0001", "v0002"]
    assert len(_stored_models(store)) == 1
