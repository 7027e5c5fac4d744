"""The stream: chunks of events drawn from a fit, endlessly and reproducibly.

Each chunk plans sessions of the active users (:mod:`~benchmarks.streams.sessions`),
draws an item by popularity for every event, scores it with the model of
:class:`~benchmarks.streams.params.StreamFit` plus fresh noise, lets a planted drift act
(:mod:`~benchmarks.streams.drifts`), turns the score into a rating on the user's scale
and stamps it with an arrival time (:mod:`~benchmarks.streams.arrivals`). Memory is that
of one chunk and the active users, whatever the length of the stream.

Each concern draws from its own random stream, split from ``seed``, and chunks never
depend on how many events were asked for: the first ``n`` events of a long stream are
the stream of ``n`` events (a drift planted at a fraction of the length aside).

Examples
--------
>>> config = GeneratorConfig(events=5_000, seed=1, drift="sudden")
>>> stream = generate_stream(config)
>>> len(stream), stream.user_ids[0], float(stream.ratings.min()) >= 0.5
(5000, 'u...', True)
>>> generate_stream(GeneratorConfig(events=1_000, seed=1)).ratings.tolist() == (
...     stream.ratings[:1_000].tolist())
True
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.datasets import RatingStream
from benchmarks.streams.arrivals import Arrivals
from benchmarks.streams.drifts import ChunkEvents, Drift, GroundTruth, make_drift
from benchmarks.streams.params import StreamFit, load_fit
from benchmarks.streams.population import Catalogue, FreshUsers, item_id, user_id
from benchmarks.streams.sessions import ActiveUsers, interleave
from benchmarks.traces import TRACES, make_trace

__all__ = ["EventChunk", "GeneratorConfig", "StreamGenerator", "generate_stream"]

#: Events planned per chunk: large enough that numpy's per-call cost vanishes, small
#: enough to stay in cache. Fixed, so a seed gives one stream.
CHUNK_EVENTS = 32_768
#: 2020-09-13: generated streams start here unless told otherwise.
DEFAULT_START = 1_600_000_000.0


@dataclass(frozen=True)
class GeneratorConfig:
    """A generated stream, fully described; validates itself.

    Parameters
    ----------
    events
        Length of the stream.
    seed
        The same seed (and fit) gives the same stream.
    fit
        The model's parameters (default: the MovieLens fit).
    trace, rate, speed
        Arrival rate: a trace of ``benchmarks.traces`` (``rate`` for ``constant`` only),
        played ``speed`` times faster.
    poisson
        Random arrivals at the trace's rate, or each event exactly when due.
    start
        Timestamp of the first instant of the trace.
    drift, drift_at, drift_options
        A drift of ``benchmarks.streams.drifts.DRIFTS`` planted at fraction ``drift_at``
        of the stream, with its own options (``share``, ``ramp``, ``shift``).
    active_users, items
        Users active at once and catalogue size (default: the fit's).
    """

    events: int
    seed: int = 0
    fit: StreamFit = field(default_factory=load_fit)
    trace: str = "constant"
    rate: float | None = None
    speed: float = 1.0
    poisson: bool = True
    start: float = DEFAULT_START
    drift: str | None = None
    drift_at: float = 0.6
    drift_options: dict[str, Any] = field(default_factory=dict)
    active_users: int | None = None
    items: int | None = None

    def __post_init__(self) -> None:
        if self.events < 1:
            raise ValueError(f"events must be at least 1, got {self.events}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.trace not in TRACES:
            raise ValueError(f"unknown trace {self.trace!r}; choose from {', '.join(TRACES)}")
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ValueError(f"speed must be a positive number, got {self.speed}")
        if not 0.0 <= self.drift_at <= 1.0:
            raise ValueError(f"drift_at must be a fraction in [0, 1], got {self.drift_at}")
        for name in ("active_users", "items"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.make_drift()  # an unknown drift or option fails here, not mid-stream
        make_trace(self.trace, rate=self.rate)

    def make_drift(self) -> Drift | None:
        if self.drift is None:
            return None
        return make_drift(self.drift, int(self.drift_at * self.events), **self.drift_options)


@dataclass(frozen=True)
class EventChunk:
    """Events ``start`` to ``start + n`` of a stream, as columns (``n`` each)."""

    start: int
    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray
    drifted: np.ndarray

    def __len__(self) -> int:
        return self.users.size

    def head(self, n: int) -> EventChunk:
        return EventChunk(
            self.start,
            self.users[:n],
            self.items[:n],
            self.ratings[:n],
            self.timestamps[:n],
            self.drifted[:n],
        )

    def user_ids(self) -> list[str]:
        return [user_id(s) for s in self.users.tolist()]

    def item_ids(self) -> list[str]:
        return [item_id(i) for i in self.items.tolist()]


@dataclass(frozen=True)
class _Draft:
    """A chunk before rating: first index, then per event (``n``) user serial, half-star
    flag, item, latent score, whether to invert the rating, whether a drift changed it."""

    start: int
    users: np.ndarray
    half: np.ndarray
    items: np.ndarray
    latent: np.ndarray
    invert: np.ndarray
    drifted: np.ndarray


class StreamGenerator:
    """Iterate to draw a stream's chunks; ``truth`` fills in as they are drawn.

    >>> generator = StreamGenerator(GeneratorConfig(events=70_000, drift="item_shift"))
    >>> sum(len(chunk) for chunk in generator)
    70000
    >>> truth = generator.truth.to_dict()
    >>> truth["onset"], truth["drift"], truth["drifted_events"] > 0
    (42000, 'item_shift', True)
    """

    def __init__(self, config: GeneratorConfig) -> None:
        self.config = config
        fit = config.fit
        streams = np.random.SeedSequence(config.seed).spawn(8)
        catalogue_rng, users_rng, self._sessions_rng, self._items_rng = (
            np.random.default_rng(s) for s in streams[:4]
        )
        self._noise_rng, arrivals_rng, self._drift_rng, self._merge_rng = (
            np.random.default_rng(s) for s in streams[4:]
        )
        self.catalogue = Catalogue.draw(fit, catalogue_rng, config.items)
        self.active = ActiveUsers(
            FreshUsers(fit, users_rng), config.active_users or fit.active_users
        )
        trace = make_trace(config.trace, speed=config.speed, seed=config.seed, rate=config.rate)
        self.arrivals = Arrivals(trace, config.start, arrivals_rng, poisson=config.poisson)
        self.drift = config.make_drift()
        self.truth = GroundTruth(self.drift)
        self._cohort_pending = self.drift is not None and self.drift.cohort_share > 0

    def __iter__(self) -> Iterator[EventChunk]:
        emitted = 0
        while emitted < self.config.events:
            chunk = self._next_chunk()
            if emitted + len(chunk) > self.config.events:
                chunk = chunk.head(self.config.events - emitted)
            self.truth.observe(
                chunk.start, chunk.timestamps, chunk.drifted, chunk.users, chunk.items
            )
            emitted += len(chunk)
            yield chunk

    def latents(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Latent scores and half-star flags of the next ``n`` events, before they are
        rated: what :mod:`benchmarks.streams.fit` sets the rating scales' cut points on."""
        scores, halves, drawn = [], [], 0
        while drawn < n:
            draft = self._draft()
            scores.append(draft.latent)
            halves.append(draft.half)
            drawn += draft.latent.size
        return np.concatenate(scores)[:n], np.concatenate(halves)[:n]

    def _next_chunk(self) -> EventChunk:
        fit, draft = self.config.fit, self._draft()
        half = draft.half
        ratings = np.where(
            half, fit.half_star.rate(draft.latent), fit.whole_star.rate(draft.latent)
        )
        if draft.invert.any():
            flipped = np.where(half, fit.half_star.invert(ratings), fit.whole_star.invert(ratings))
            ratings = np.where(draft.invert, flipped, ratings)
        stamps = self.arrivals.next(ratings.size)
        return EventChunk(draft.start, draft.users, draft.items, ratings, stamps, draft.drifted)

    def _draft(self) -> _Draft:
        """A chunk's events up to their latent scores, the drift's effect included."""
        fit, active, drift = self.config.fit, self.active, self.drift
        start = active.events
        stop_at = None
        if self._cohort_pending and drift is not None:
            if start >= drift.onset:
                self._turn_over(drift)
            else:
                stop_at = drift.onset
        plan = active.plan(
            CHUNK_EVENTS, fit.session, fit.session_share, self._sessions_rng, stop_at
        )
        sessions = interleave(plan.lengths, plan.rounds, self._merge_rng)
        rows = plan.rows[sessions]
        users, catalogue = plan.users, self.catalogue
        n = rows.size
        items = catalogue.sample(self._items_rng, n)
        latent = fit.global_mean + users.bias[rows] + catalogue.bias[items]
        latent += np.einsum("ij,ij->i", users.factors[rows], catalogue.factors[items])
        latent += fit.noise_sd * self._noise_rng.standard_normal(n)
        drifted = np.zeros(n, dtype=bool)
        invert = drifted
        if drift is not None:
            index = np.arange(start, start + n)
            effect = drift.effect(
                ChunkEvents(
                    index,
                    users,
                    rows,
                    items,
                    catalogue,
                    plan.cohort[sessions],
                    fit.latent_per_star,
                ),
                self._drift_rng,
            )
            if effect.latent_shift is not None:
                latent += effect.latent_shift
            invert, drifted = effect.invert, effect.drifted
        return _Draft(
            start, users.serial[rows], users.half_star[rows], items, latent, invert, drifted
        )

    def _turn_over(self, drift: Drift) -> None:
        """The cohort takes its slots at the first round boundary after the onset."""
        active = self.active
        count = int(round(drift.cohort_share * len(active)))
        slots = self._drift_rng.choice(len(active), size=count, replace=False)
        active.turn_over(np.sort(slots))
        self.truth.onset = active.events
        self._cohort_pending = False


def generate_stream(config: GeneratorConfig) -> RatingStream:
    """The whole stream in memory, for replays of up to a few million events."""
    generator = StreamGenerator(config)
    users: list[str] = []
    items: list[str] = []
    ratings, stamps = [], []
    for chunk in generator:
        users.extend(chunk.user_ids())
        items.extend(chunk.item_ids())
        ratings.append(chunk.ratings)
        stamps.append(chunk.timestamps)
    return RatingStream(users, items, np.concatenate(ratings), np.concatenate(stamps))
