"""Kept top-K answers: served while the user's vector and rated items are unchanged and
the answer is young enough, never after an event of that user or a swap."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from benchmarks.bench.catalogue import synthetic_version
from service.serving.answers import KeptAnswers
from service.serving.model import ServingModel
from service.serving.topk import best_rows
from service.serving.vector import item_scores


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Served:
    """A served version whose kept answers age by ``clock``, and the rated items of
    the user the tests ask for."""

    serving: ServingModel
    clock: Clock
    rated: frozenset[str]


def _served(max_age_s: float) -> Served:
    serving = ServingModel(synthetic_version(2_000, 50, 8, seed=3), "v1", cached_answers=100)
    clock = Clock()
    # The same view, its answers kept by the test's clock.
    serving._view = replace(serving.view, answers=KeptAnswers(100, max_age_s, clock))
    assert serving.model is not None
    return Served(serving, clock, frozenset(serving.model.item_ids[:5]))


def _exact(serving: ServingModel, user: str, k: int, rated: frozenset[str]) -> list[str]:
    """The top-``k`` items of scoring every item with the current view."""
    view = serving.view
    assert view.model is not None
    vector = view.user_vector(user)
    assert vector is not None
    scores = item_scores(view.model.item_factors, view.item_bias, view.global_mean, vector)
    excluded = np.sort(view.model.encode_items(sorted(rated)))
    rows, _ = best_rows(scores, k, excluded)
    return [view.model.item_ids[r] for r in rows.tolist()]


def _others_rate(serving: ServingModel, items: list[str]) -> None:
    """Other users' events that move the items' biases (a new view)."""
    serving.learn([f"other{i}" for i in range(len(items))], items, np.full(len(items), 5.0))


def test_an_answer_outlives_other_users_events_until_its_age_runs_out() -> None:
    served = _served(max_age_s=1.0)
    serving, clock, rated = served.serving, served.clock, served.rated
    first = serving.recommend("u3", 10, rated)
    assert first is not None
    # Lift items just below the answer into it, from other users' ratings.
    runners_up = _exact(serving, "u3", 40, rated)[10:]
    _others_rate(serving, runners_up * 20)
    moved = _exact(serving, "u3", 10, rated)
    assert moved != [item for item, _ in first]  # the exact answer did change
    clock.now += 0.9
    assert serving.recommend("u3", 10, rated) == first  # kept: young enough
    clock.now += 0.2
    again = serving.recommend("u3", 10, rated)
    assert again is not None and [item for item, _ in again] == moved


def test_without_an_age_an_answer_ends_with_its_view() -> None:
    served = _served(max_age_s=0.0)
    serving, rated = served.serving, served.rated
    serving.recommend("u3", 10, rated)
    assert ("u3", 10) in serving.view.answers
    _others_rate(serving, _exact(serving, "u3", 10, rated))
    assert len(serving.view.answers) == 0


def test_an_event_of_the_user_ends_their_answer_at_once() -> None:
    served = _served(max_age_s=60.0)
    serving, rated = served.serving, served.rated
    first = serving.recommend("u3", 10, rated)
    assert first is not None
    top = first[0][0]
    # The user rates their top item: a new vector and new rated items.
    serving.learn(["u3"], [top], np.array([0.5]))
    now_rated = rated | {top}
    after = serving.recommend("u3", 10, now_rated)
    assert after is not None and top not in [item for item, _ in after]
    assert [item for item, _ in after] == _exact(serving, "u3", 10, now_rated)
    # Same rated items but a new vector (an event on an item already rated) ends it too.
    kept = serving.recommend("u3", 10, now_rated)
    serving.learn(["u3"], [top], np.array([5.0]))
    assert serving.recommend("u3", 10, now_rated) != kept
    assert [i for i, _ in serving.recommend("u3", 10, now_rated) or []] == _exact(
        serving, "u3", 10, now_rated
    )


def test_rated_items_that_are_not_a_frozenset_are_never_kept() -> None:
    answers = KeptAnswers(10, 5.0)
    answers.put("u", 5, {"a"}, None, (("b", 1.0),))
    answers.put("v", 5, frozenset({"a"}), None, (("b", 1.0),))
    assert ("u", 5) not in answers and ("v", 5) in answers


def test_a_full_store_starts_over_rather_than_growing() -> None:
    answers = KeptAnswers(3, 5.0)
    rated = frozenset()
    for user in "abcd":
        answers.put(user, 5, rated, None, ())
    assert len(answers) == 1 and ("d", 5) in answers


def test_a_new_index_or_version_starts_with_no_kept_answers() -> None:
    serving = _served(max_age_s=60.0).serving
    serving.recommend("u3", 10, frozenset())
    assert len(serving.view.answers) == 1
    serving.attach_index(None)
    assert len(serving.view.answers) == 0
    swapped = ServingModel(serving.model, "v2", cached_answers=100, answer_max_age_s=60.0)
    assert len(swapped.view.answers) == 0
