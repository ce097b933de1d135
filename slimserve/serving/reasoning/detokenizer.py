"""Streaming-safe detokenization: token ids arrive a few at a time, text leaves in whole characters.

Byte-level tokenizers split many characters (accents, CJK, emoji) over several tokens; decoding a prefix
of them yields U+FFFD. ``IncrementalDetokenizer`` decodes a short window of recent tokens (so merges
and leading-space rules see their context), emits only the text that the newest tokens added, and holds
back while that text ends in an incomplete character. ``flush`` releases whatever is left at the end.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing sequence of token ids into text pieces that never split a character."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window: tokens before it are never decoded again
        self._read = 0  # tokens whose text has been emitted

    @property
    def token_count(self) -> int:
        """Tokens pushed so far."""
        return len(self._ids)

    def _decode(self, begin: int, end: int | None = None) -> str:
        return self._tokenizer.decode(self._ids[begin:end], skip_special_tokens=self._skip_special)

    def _new_text(self) -> str:
        emitted = self._decode(self._prefix, self._read)
        current = self._decode(self._prefix)
        if current.startswith(emitted):
            return current[len(emitted) :]
        # A decoder rule rewrote text before the new tokens (rare): emit only what is new at the end.
        common = 0
        while common < min(len(current), len(emitted)) and current[common] == emitted[common]:
            common += 1
        return current[max(common, len(emitted)) :] if len(current) > len(emitted) else ""

    def push(self, token_ids: Iterable[int]) -> str:
        """Add tokens; return the text they complete ("" while a character is still incomplete)."""
        self._ids.extend(int(t) for t in token_ids)
        if self._read == len(self._ids):
            return ""
        text = self._new_text()
        if not text or text.endswith(REPLACEMENT_CHAR):
            return ""  # hold back: the next tokens may complete the character
        self._prefix, self._read = self._read, len(self._ids)
        return text

    def flush(self) -> str:
        """The text of tokens still held back (an incomplete character at the very end shows as U+FFFD)."""
        if self._read == len(self._ids):
            return ""
        text = self._new_text()
        self._prefix, self._read = self._read, len(self._ids)
        return text
