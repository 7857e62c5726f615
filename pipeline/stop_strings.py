"""Stop strings: the answer ends before the first occurrence of any of them, which is not returned.

`StopStringFilter` cuts a text arriving in pieces: it passes on what can no longer be part of a
stop string and holds back a tail that could still be the start of one, so a stream never shows a
stop string or a piece of one. Joined, its output is the joined input up to its `first_stop`.
"""
from __future__ import annotations

from collections.abc import Sequence


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first occurrence of any stop string starts in text, or None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


class StopStringFilter:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.stopped = False  # a stop string has been seen: everything after it is dropped
        self._held = ""  # text not yet passed on: it may be the start of a stop string

    def push(self, piece: str) -> str:
        """The part of the text so far that is now certain to be in the answer."""
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        text = self._held + piece
        at = first_stop(text, self.stops)
        if at is not None:
            self.stopped, self._held = True, ""
            return text[:at]
        keep = self._partial_tail(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def finish(self) -> str:
        """What was held back: at the end of the text it can no longer start a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_tail(self, text: str) -> int:
        """The length of the longest tail of text that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
