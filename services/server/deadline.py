"""A request's deadline, made once where the request enters a node (the route's edge) and passed down
as it is: every wait below it ends by this instant, and a call to another node sends the time left
(its clock is not ours)."""
from __future__ import annotations

import time


class Deadline(float):
    """A time.monotonic() instant. A float, so the stage waits and queues take it as their deadline."""

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        """Seconds until it passes; 0 once it has."""
        return max(0.0, self - time.monotonic())

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self
