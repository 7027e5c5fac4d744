"""Where a data set is found, and how one is fetched: nothing of MovieLens ships.

MovieLens' licence forbids redistributing it, so Driftline's wheel carries none of it.
A run looks for the ratings in this order and says which it took:

1. ``--dataset PATH``: a ratings file, or a folder holding one (directly or in the data
   set's own folder, ``ml-latest-small/``);
2. ``$DRIFTLINE_DATASETS``: a folder of data sets, each in its own folder
   (``$DRIFTLINE_DATASETS/ml-latest-small/ratings.csv``);
3. the cache, where ``driftline datasets fetch`` puts them:
   ``$XDG_CACHE_HOME/driftline/datasets`` (``~/.cache/driftline/datasets``);
4. otherwise a stream generated from the parameters fitted to MovieLens
   (``benchmarks/streams``), which is free to ship.

Examples
--------
>>> found = resolve(env={"DRIFTLINE_DATASETS": "/nowhere", "XDG_CACHE_HOME": "/nowhere"})
>>> found.generated, found.origin
(True, 'generated')
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.datasets import RatingStream, load_ratings

__all__ = [
    "DATASETS",
    "ENV_VAR",
    "ChecksumError",
    "DatasetSpec",
    "FetchError",
    "Resolved",
    "cache_dir",
    "fetch",
    "open_ratings",
    "resolve",
]

ENV_VAR = "DRIFTLINE_DATASETS"
RATINGS_NAMES = ("ratings.csv", "ratings.csv.gz")


@dataclass(frozen=True)
class DatasetSpec:
    """A data set Driftline knows by name.

    ``folder`` is its folder under ``$DRIFTLINE_DATASETS`` or the cache; ``url`` and
    ``sha256`` say where ``fetch`` downloads its zip and what the zip must hash to
    (None: not downloadable, bring your own copy); ``members`` are the files taken from
    the zip's ``folder/``.
    """

    name: str
    folder: str
    title: str
    url: str | None = None
    sha256: str | None = None
    members: tuple[str, ...] = ("ratings.csv", "movies.csv", "README.txt")


DATASETS: dict[str, DatasetSpec] = {
    "movielens-small": DatasetSpec(
        name="movielens-small",
        folder="ml-latest-small",
        title="MovieLens ml-latest-small",
        url="https://files.grouplens.org/datasets/movielens/ml-latest-small.zip",
        # The zip of the release generated on 2018-09-26, as GroupLens serves it.
        sha256="696d65a3dfceac7c45750ad32df2c259311949efec81f0f144fdfb91ebc9e436",
    ),
    "movielens-1m-part": DatasetSpec(
        name="movielens-1m-part",
        folder="ml-1m-part",
        title="MovieLens 1M, users 1-2,999",
    ),
}


class FetchError(Exception):
    """A download that failed; the message is one line meant for a person."""


class ChecksumError(FetchError):
    """A download whose SHA-256 is not the one expected; nothing was kept."""


@dataclass(frozen=True)
class Resolved:
    """Where a run's ratings come from: a file found at ``origin`` (``--dataset``,
    ``DRIFTLINE_DATASETS`` or ``cache``), or ``generated`` when none was found."""

    spec: DatasetSpec
    origin: str
    ratings: Path | None
    searched: tuple[str, ...] = ()

    @property
    def generated(self) -> bool:
        return self.ratings is None

    @property
    def titles(self) -> Path | None:
        """``movies.csv`` beside the ratings, when there is one."""
        if self.ratings is None:
            return None
        for name in ("movies.csv", "movies.csv.gz"):
            if (self.ratings.parent / name).is_file():
                return self.ratings.parent / name
        return None

    @property
    def label(self) -> str:
        """A short name for reports: the file's name, or ``generated``."""
        if self.ratings is None:
            return f"generated (fit to {self.spec.title})"
        return str(self.ratings) if self.origin == "--dataset" else self.ratings.parent.name

    def describe(self) -> str:
        """One sentence for a person: what is used, and from where."""
        if self.ratings is not None:
            return f"{self.spec.title} from {self.origin}: {self.ratings}"
        looked = "; ".join(self.searched) or "nowhere"
        return (
            f"No {self.spec.title} found (looked in {looked}): using a stream generated from "
            f"the parameters fitted to it (`driftline generate`). "
            f"`driftline datasets fetch {self.spec.name}` downloads it where a network is."
        )


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/driftline/datasets``, ``~/.cache/driftline/datasets`` without it."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "driftline" / "datasets"


def _ratings_in(folder: Path) -> Path | None:
    for name in RATINGS_NAMES:
        if (folder / name).is_file():
            return folder / name
    return None


def _spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown data set {name!r}; choose from {', '.join(DATASETS)}") from None


def resolve(
    path: Path | str | None = None,
    name: str = "movielens-small",
    env: Mapping[str, str] | None = None,
) -> Resolved:
    """Find data set ``name``: ``path``, then ``$DRIFTLINE_DATASETS``, then the cache.

    A ``path`` that is a name in ``DATASETS`` (and no file or folder) picks that data
    set, looked for as ``name`` would be. An explicit ``path`` that holds no ratings
    file raises ``FileNotFoundError``; with none, a data set found nowhere resolves to
    the generated stream.
    """
    if path is not None and str(path) in DATASETS and not Path(path).exists():
        path, name = None, str(path)  # a registered name (``--dataset movielens-1m-part``)
    spec, env = _spec(name), os.environ if env is None else env
    if path is not None:
        given = Path(path).expanduser()
        if given.is_file():
            return Resolved(spec, "--dataset", given)
        found = _ratings_in(given) or _ratings_in(given / spec.folder)
        if found is None:
            raise FileNotFoundError(f"no ratings file at {given} (nor {given / spec.folder})")
        return Resolved(spec, "--dataset", found)
    searched = []
    shared = env.get(ENV_VAR)
    if shared:
        folder = Path(shared).expanduser() / spec.folder
        searched.append(f"${ENV_VAR}={shared}")
        found = _ratings_in(folder)
        if found is not None:
            return Resolved(spec, ENV_VAR, found.resolve())
    cache = cache_dir(env) / spec.folder
    searched.append(str(cache))
    found = _ratings_in(cache)
    if found is not None:
        return Resolved(spec, "cache", found)
    return Resolved(spec, "generated", None, tuple(searched))


def open_ratings(
    path: Path | str | None = None,
    limit: int | None = None,
    name: str = "movielens-small",
    seed: int = 0,
    drift: str | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[RatingStream, Resolved]:
    """The ratings ``resolve`` finds, in timestamp order, and where they came from.

    The generated stream stands in for a missing data set with the data set's length
    (or ``limit``) and the generator's ``drift``, if any, planted at 60 %.
    """
    found = resolve(path, name, env)
    if found.ratings is not None:
        return load_ratings(found.ratings, limit=limit), found
    from benchmarks.streams import GeneratorConfig, generate_stream, load_fit

    fit = load_fit()
    config = GeneratorConfig(events=limit or fit.events, seed=seed, fit=fit, drift=drift)
    return generate_stream(config), found


def fetch(
    name: str = "movielens-small",
    *,
    cache: Path | None = None,
    url: str | None = None,
    sha256: str | None = None,
    timeout_s: float = 60.0,
    force: bool = False,
) -> Path:
    """Download data set ``name``, check its SHA-256 and unpack it into the cache.

    Returns the ratings file. ``url`` and ``sha256`` replace the registry's (a mirror
    of the same zip). Raises ``FetchError`` when the download fails, ``ChecksumError``
    when the zip is not the one expected; the cache is left as it was either way.
    """
    spec = _spec(name)
    url, sha256 = url or spec.url, (sha256 or spec.sha256 or "").lower()
    if url is None or not sha256:
        raise FetchError(f"{spec.title} cannot be downloaded; put a copy under ${ENV_VAR}")
    target = (cache or cache_dir()) / spec.folder
    existing = _ratings_in(target)
    if existing is not None and not force:
        return existing
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{spec.folder}-") as tmp:
        archive = Path(tmp) / "download.zip"
        digest = _download(url, archive, timeout_s)
        if digest != sha256:
            raise ChecksumError(
                f"{url} has SHA-256 {digest}, expected {sha256}: not the {spec.title} "
                "this version knows; nothing was kept"
            )
        unpacked = Path(tmp) / spec.folder
        _unpack(archive, spec, unpacked)
        if target.exists():
            shutil.rmtree(target)
        unpacked.rename(target)
    found = _ratings_in(target)
    assert found is not None  # _unpack checked the ratings were there
    return found


def _download(url: str, archive: Path, timeout_s: float) -> str:
    """Stream ``url`` into ``archive``; its SHA-256 (hex)."""
    digest = hashlib.sha256()
    try:
        with (
            httpx.stream("GET", url, timeout=timeout_s, follow_redirects=True) as response,
            archive.open("wb") as out,
        ):
            response.raise_for_status()
            for block in response.iter_bytes(1 << 16):
                digest.update(block)
                out.write(block)
    except httpx.HTTPError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise FetchError(f"cannot download {url}: {reason}") from exc
    return digest.hexdigest()


def _unpack(archive: Path, spec: DatasetSpec, folder: Path) -> None:
    """The zip's ``spec.folder/<member>`` files, flat into ``folder``."""
    folder.mkdir()
    try:
        with zipfile.ZipFile(archive) as bundle:
            names = set(bundle.namelist())
            for member in spec.members:
                inside = f"{spec.folder}/{member}"
                if inside not in names:
                    continue
                with bundle.open(inside) as source, (folder / member).open("wb") as out:
                    shutil.copyfileobj(source, out)
    except zipfile.BadZipFile as exc:
        raise FetchError(f"the download is not a zip archive: {exc}") from exc
    if _ratings_in(folder) is None:
        raise FetchError(f"the archive holds no {spec.folder}/ratings.csv")
