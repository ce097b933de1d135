"""Stop strings enforced on streamed text: cut before the first match, never emit a partial match.

Text is emitted as soon as it cannot be the start of a stop string; the longest tail that could still
grow into one is held back until the next piece decides it (or ``flush`` releases it at the end).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Filters a text stream against ``stops``; ``matched`` names the stop string once one appeared."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.matched = ""
        self._pending = ""

    def push(self, text: str) -> str:
        """Add text; return what is safe to emit. After a match, returns the text before it, then ""."""
        if self.matched:
            return ""
        if not self.stops:
            return text
        buffer = self._pending + text
        hits = [(buffer.find(stop), stop) for stop in self.stops]
        hits = [(index, stop) for index, stop in hits if index >= 0]
        if hits:
            index, stop = min(hits)
            self.matched, self._pending = stop, ""
            return buffer[:index]
        keep = self._undecided_tail(buffer)
        self._pending = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def _undecided_tail(self, buffer: str) -> int:
        """Length of the longest tail of ``buffer`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def flush(self) -> str:
        """At the end of the stream: the held-back tail (it never completed a stop string)."""
        text, self._pending = ("" if self.matched else self._pending), ""
        return text
