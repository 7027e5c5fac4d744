"""Where a data set is found, fetching one with its checksum, and the generated default."""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.datasets.registry import (
    ChecksumError,
    FetchError,
    cache_dir,
    fetch,
    open_ratings,
    resolve,
)
from service.cli import app

RATINGS = "userId,movieId,rating,timestamp\n1,10,4.0,300\n2,20,3.5,100\n"


def _folder(root: Path, name: str = "ml-latest-small") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "ratings.csv").write_text(RATINGS)
    return folder


def test_an_explicit_path_wins_then_the_environment_then_the_cache(tmp_path: Path) -> None:
    shared, cache = tmp_path / "shared", tmp_path / "xdg"
    env = {"DRIFTLINE_DATASETS": str(shared), "XDG_CACHE_HOME": str(cache)}
    assert resolve(env=env).origin == "generated"
    _folder(cache / "driftline" / "datasets")
    assert resolve(env=env).origin == "cache"
    _folder(shared)
    found = resolve(env=env)
    assert (found.origin, found.ratings) == (
        "DRIFTLINE_DATASETS",
        shared / "ml-latest-small" / "ratings.csv",
    )
    own = tmp_path / "mine.tsv"
    own.write_text("a\tx\t1\t5\n")
    assert resolve(own, env=env).ratings == own
    assert resolve(shared, env=env).ratings == shared / "ml-latest-small" / "ratings.csv"
    with pytest.raises(FileNotFoundError, match="no ratings file"):
        resolve(tmp_path / "missing", env=env)


def test_a_registered_name_given_as_the_dataset_finds_that_data_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    _folder(shared, "ml-1m-part")
    env = {"DRIFTLINE_DATASETS": str(shared), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    monkeypatch.chdir(tmp_path)
    found = resolve("movielens-1m-part", env=env)
    assert (found.spec.name, found.origin) == ("movielens-1m-part", "DRIFTLINE_DATASETS")
    assert found.ratings == shared / "ml-1m-part" / "ratings.csv"


def test_without_movielens_a_run_gets_the_generated_stream_and_is_told_so(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    stream, found = open_ratings(limit=3_000, env=env)
    assert found.generated and len(stream) == 3_000
    assert "No MovieLens ml-latest-small found" in found.describe()
    assert "driftline datasets fetch movielens-small" in found.describe()
    assert cache_dir(env) == tmp_path / "driftline" / "datasets"


def _zip(extra: str = "") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        bundle.writestr("ml-latest-small/ratings.csv", RATINGS + extra)
        bundle.writestr("ml-latest-small/movies.csv", "movieId,title,genres\n10,Ten,Drama\n")
        bundle.writestr("ml-latest-small/README.txt", "licence")
        bundle.writestr("ml-latest-small/tags.csv", "not taken")
    return buffer.getvalue()


@pytest.fixture
def served() -> Iterator[tuple[str, bytes]]:
    """A local HTTP server answering ``/small.zip`` with a small MovieLens-shaped zip."""
    payload = _zip()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            if self.path != "/small.zip":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", payload
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_downloads_checks_and_unpacks_into_the_cache(
    served: tuple[str, bytes], tmp_path: Path
) -> None:
    base, payload = served
    digest = hashlib.sha256(payload).hexdigest()
    ratings = fetch(cache=tmp_path, url=f"{base}/small.zip", sha256=digest)
    assert ratings == tmp_path / "ml-latest-small" / "ratings.csv"
    assert sorted(p.name for p in ratings.parent.iterdir()) == [
        "README.txt",
        "movies.csv",
        "ratings.csv",
    ]
    assert resolve(env={"XDG_CACHE_HOME": str(tmp_path.parent / "none")}).generated
    # Cached: a second fetch does not download (a wrong URL would fail otherwise).
    assert fetch(cache=tmp_path, url=f"{base}/gone.zip", sha256=digest) == ratings


def test_a_checksum_mismatch_keeps_nothing(served: tuple[str, bytes], tmp_path: Path) -> None:
    base, _ = served
    with pytest.raises(ChecksumError, match="expected 00"):
        fetch(cache=tmp_path, url=f"{base}/small.zip", sha256="00" * 32)
    assert not (tmp_path / "ml-latest-small").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no partial download left behind


def test_a_failed_download_says_why(served: tuple[str, bytes], tmp_path: Path) -> None:
    base, _ = served
    with pytest.raises(FetchError, match="404"):
        fetch(cache=tmp_path, url=f"{base}/missing.zip", sha256="00" * 32)
    with pytest.raises(FetchError, match="cannot be downloaded"):
        fetch("movielens-1m-part", cache=tmp_path)


def test_the_fetch_command_reports_in_one_line(served: tuple[str, bytes], tmp_path: Path) -> None:
    base, payload = served
    runner = CliRunner()
    args = ["datasets", "fetch", "movielens-small", "--cache", str(tmp_path)]
    wrong = runner.invoke(app, [*args, "--url", f"{base}/small.zip", "--sha256", "ab" * 32])
    assert wrong.exit_code == 1 and "has SHA-256" in wrong.output
    digest = hashlib.sha256(payload).hexdigest()
    right = runner.invoke(app, [*args, "--url", f"{base}/small.zip", "--sha256", digest])
    assert right.exit_code == 0, right.output
    assert str(tmp_path / "ml-latest-small" / "ratings.csv") in right.output
