"""An epoch of the in-process worker kind: the coordinator trains it itself.

The ``inprocess`` kind (:mod:`configurator.kinds`) has no workers and no start-up: the
numpy trainer of ``functions/`` (:meth:`functions.mf.BiasedMF.fit_epoch`, the update
:class:`retrain.backends.InProcessBackend` runs) passes over the whole window in the
service's process. It is billed as the configurator prices it, each second at Lambda's
vCPU-second: the seconds are the serving host's, and that is what moving them off the
host would cost. The bill is an invocation record like a worker's, so the job's cost,
its checkpoint and the configurator's recalibration see it as any other epoch's.
"""

from __future__ import annotations

import math
import time

import numpy as np

from configurator.kinds import in_process_model
from configurator.space import IN_PROCESS, EpochConfig
from functions.mf import BiasedMF
from functions.runtimes import InvocationRecord
from retrain.job_objects import EncodedWindow

#: Seeds an in-process epoch's shuffle apart from any worker's ``(seed, epoch, worker)``.
HERE_STREAM = 1 << 20


def train_here(
    model: BiasedMF, data: EncodedWindow, config: EpochConfig, epoch: int, seed: int, job_id: str
) -> InvocationRecord:
    """Epoch ``epoch`` of ``model`` on the whole of ``data`` in this process, with
    ``config``'s batch size and learning rate; returns its bill."""
    rng = np.random.default_rng([seed, epoch, HERE_STREAM])
    model.learning_rate = config.learning_rate
    started = time.perf_counter()
    loss = model.fit_epoch(
        data.users, data.items, data.ratings, batch_size=config.batch_size, rng=rng
    )
    seconds = time.perf_counter() - started
    billed_ms = math.ceil(seconds * 1000)
    return InvocationRecord(
        f"{IN_PROCESS}-{job_id}-{epoch}",
        memory_mb=config.memory_mb,
        duration_s=seconds,
        billed_ms=billed_ms,
        cost_usd=billed_ms / 1000 * in_process_model().second_usd,
        result={"samples": len(data.ratings), "train_loss": float(loss)},
        labels={"kind": IN_PROCESS, "epoch": epoch, "worker": 0},
    )
