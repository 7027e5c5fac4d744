"""A function job's whole bill: Lambda's and the object store's."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from functions.performance import WORKER_REQUESTS
from functions.pricing import ObjectStorePrices, object_store_prices
from functions.runtimes.base import InvocationRecord

#: Of a worker's object-store requests, the writes (its delta); the rest are reads.
WORKER_PUTS = 1


@dataclass(frozen=True)
class FunctionBill:
    """What a job's invocations cost, in parts.

    ``lambda_usd`` is each invocation's GB-seconds per started millisecond plus its
    request price, initialisation included (the simulator counts a cold start in the
    billed duration, as Lambda has billed the init phase since August 2025);
    ``store_usd`` is the object-store requests the workers make (snapshot and shard
    read, delta written) and the coordinator's per epoch (deltas read, snapshot written).

    >>> from functions.runtimes.base import InvocationRecord
    >>> records = [InvocationRecord("r", duration_s=1.0, cost_usd=1.68667e-05)] * 4
    >>> bill = function_bill(records, epochs=2)
    >>> round(bill.lambda_usd, 8), round(bill.store_usd, 8), round(bill.total_usd, 8)
    (6.747e-05, 3.48e-05, 0.00010227)
    """

    lambda_usd: float
    store_usd: float

    @property
    def total_usd(self) -> float:
        return self.lambda_usd + self.store_usd


def function_bill(
    records: Iterable[InvocationRecord],
    epochs: int,
    store: ObjectStorePrices | None = None,
) -> FunctionBill:
    """The bill of ``records`` (every invocation of a job) over ``epochs`` epochs."""
    store = store or object_store_prices()
    records = list(records)
    reads = len(records) * (WORKER_REQUESTS - WORKER_PUTS) + len(records)  # + coordinator's
    writes = len(records) * WORKER_PUTS + epochs
    return FunctionBill(
        lambda_usd=sum(r.cost_usd for r in records),
        store_usd=reads * store.get_request_usd + writes * store.put_request_usd,
    )
