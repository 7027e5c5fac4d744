"""Tiny handlers the runtime tests invoke inside real worker processes."""

from __future__ import annotations

import os
import time
from typing import Any


def echo(event: dict, context: Any) -> dict:
    return {
        "echo": event,
        "pid": os.getpid(),
        "remaining_ms": context.get_remaining_time_in_millis(),
        "memory_mb": context.memory_limit_in_mb,
    }


def niceness(event: dict, context: Any) -> dict:
    return {"niceness": os.nice(0)}


def sleep(event: dict, context: Any) -> dict:
    time.sleep(event["seconds"])
    return {"slept": event["seconds"]}


def hog(event: dict, context: Any) -> dict:
    block = bytearray(event["mb"] * 1024 * 1024)
    for i in range(0, len(block), 4096):  # touch every page so it is resident
        block[i] = 1
    time.sleep(0.5)
    return {"held": len(block)}


def fail(event: dict, context: Any) -> dict:
    raise ValueError("bad shard")
