"""A version in shadow: a second serving state that learns the stream beside the serving one.

The rollout guard (``service.rollout.guard``) compares two versions on the same live
events: a version just published against the serving one (the candidate), and after a
promotion the version it replaced (the previous one). The learner runs the shadow on
its test-then-train walk: each labelled event is predicted by the serving state and by
the shadow, each with its own fold-in and before either learns it, then both learn it;
the ranking sample's events are ranked by both. Requests never see the shadow: it is
one more serving state in memory, kept current, which a promotion installs as it is.

Ownership: the learner holds the shadow and runs it under its lock; the guard reads
each batch's ``ShadowBatch`` from the learner's ``Evaluation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.serving.model import ServingModel
from service.serving.registry import LoadedVersion
from service.serving.view import ServingView

#: ``candidate``: published, not served yet; ``previous``: replaced by a promotion.
Role = Literal["candidate", "previous"]


@dataclass(frozen=True)
class ShadowBatch:
    """One batch's labelled events as the serving version and the shadow saw them.

    Attributes
    ----------
    version, serving_version
        The shadow's version and the serving one that predicted the same events.
    role
        The shadow's role (``Role``).
    users
        The batch's users, once each.
    user_codes
        Each labelled event's user as its index in ``users`` ``(n,)``.
    serving_errors, shadow_errors
        Each labelled event's squared error by either ``(n,)``.
    ranked_codes
        The user of each ranked event of the batch, as ``user_codes`` has it ``(m,)``.
    serving_ranks, shadow_ranks
        Each ranked event's rank by either ``(m,)`` (``drift.ranking``: 0 not ranked).
    """

    version: str | None
    serving_version: str | None
    role: Role
    users: list[str]
    user_codes: np.ndarray
    serving_errors: np.ndarray
    shadow_errors: np.ndarray
    ranked_codes: np.ndarray
    serving_ranks: np.ndarray
    shadow_ranks: np.ndarray


class ShadowTrack:
    """A serving state for ``loaded`` that predicts and learns beside the serving one.

    Parameters
    ----------
    serving
        The state, built like a swap builds one (``ServingBuilder``) and caught up to
        the learner's position when the shadow starts.
    loaded
        The version it serves.
    role
        Why it runs (``Role``).
    """

    def __init__(self, serving: ServingModel, loaded: LoadedVersion, role: Role) -> None:
        self.serving = serving
        self.loaded = loaded
        self.role: Role = role

    @property
    def version(self) -> str:
        return self.loaded.version

    @property
    def view(self) -> ServingView:
        return self.serving.view

    def predict_then_learn(
        self, users: Sequence[str], items: Sequence[str], ratings: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Predictions ``(n,)`` and the user vectors they were made with ``(n x k+2)``,
        each event learnt after it is predicted, as the serving state does."""
        return self.serving.predict_then_learn_vectors(users, items, ratings)
