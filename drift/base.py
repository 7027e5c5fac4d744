"""Abstract base of Driftline's drift detectors.

Kept as small as river's ``river.base.DriftDetector``: a detector is fed one value at a
time through ``update`` and says through the read-only ``drift_detected`` whether that
value completed a drift. Everything a detector needs is passed to ``__init__`` and
stored unchanged, so ``clone`` can rebuild a fresh detector from its parameters alone
(the retraining side restarts monitoring without knowing the detector's class).
"""

from __future__ import annotations

import abc
import copy
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    import numpy as np

    from drift.event_record import ErrorRecord

__all__ = ["DriftDetector", "RecordLoader"]

#: Reads back a record saved as it grew: ``(epoch, start, end)`` → its errors and user
#: keys numbered ``start`` to ``end`` of the epoch, or None when they are not all saved.
RecordLoader = Callable[[int, int, int], "tuple[np.ndarray, np.ndarray] | None"]


class DriftDetector(abc.ABC):
    """A detector of change in a stream of values.

    Subclasses store every ``__init__`` argument under an attribute of the same name;
    ``get_params`` and ``clone`` rely on that convention.
    """

    def __init__(self) -> None:
        self._drift_detected = False

    @property
    def drift_detected(self) -> bool:
        """Whether the last call to ``update`` signalled a drift."""
        return self._drift_detected

    @abc.abstractmethod
    def update(self, x: Any) -> Any:
        """Feed one value to the detector."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget everything seen so far, keeping the parameters."""

    def on_swap(self, continues_regime: bool = False) -> None:
        """A new model version starts serving.

        ``continues_regime`` says the version was trained on a schedule (a refresh, a
        periodic or batched retrain), not because the stream changed or an operator
        rolled back: the errors before the swap still describe the stream the new
        version serves. The default restarts the detector either way: a new version
        has a new error level by design. A detector that can keep its reference
        through a scheduled swap overrides this, so that a swap landing just after a
        drift's onset does not hide the drift.
        """
        self.reset()

    def state(self) -> dict[str, Any]:
        """What the detector has learnt, as plain JSON, for ``restore`` after a restart.

        The default is empty: a detector that keeps state it cannot afford to lose
        overrides both methods.
        """
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what ``state`` returned (on a detector with the same parameters)."""
        self.reset()

    def state_apart(self) -> tuple[dict[str, Any], ErrorRecord | None]:
        """``state`` without the record of recent errors, and that record.

        A record is most of a detector's state and only grows at its end, so a caller
        that saves the state often saves the record as it grows (``ErrorRecord.since``)
        and the rest whole. The default keeps no record apart: (``state()``, None).
        """
        return self.state(), None

    def restore_apart(self, state: dict[str, Any], load_record: RecordLoader) -> None:
        """Take back what ``state_apart`` returned, the record read with ``load_record``.

        Raises
        ------
        ValueError
            When the state does not load or its record is not all saved; the detector
            is left reset.
        """
        self.restore(state)

    def get_params(self) -> dict[str, Any]:
        """The ``__init__`` arguments this detector was built with.

        Returns
        -------
        dict
            Parameter name to value, read back from the attributes of the same name.
        """
        signature = inspect.signature(type(self).__init__)
        names = [
            name
            for name, param in signature.parameters.items()
            if name != "self" and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
        ]
        return {name: getattr(self, name) for name in names}

    def clone(self) -> Self:
        """A fresh detector with the same parameters and none of the state.

        Parameters are deep-copied so the clone never shares a mutable default with
        the original.
        """
        return type(self)(**copy.deepcopy(self.get_params()))
