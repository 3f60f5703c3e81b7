"""A sequence's output text as its tokens come: incremental detokenization and stop
strings (pure).

Each update decodes only the tokens since the last complete piece of text, with the
piece before them as context (vLLM's way: a tokenizer may decode a token differently
at the start of a text), and appends what they add: the cost per token does not grow
with the output. While the new part ends in an incomplete character (U+FFFD from a
partial UTF-8 sequence) it waits for the next token. A stop string ends the sequence
and is cut from the text, with what follows it. While the sequence runs, the last
``longest stop - 1`` characters are held back, so a stop string split over two
responses is never half sent.
"""

from __future__ import annotations

from collections.abc import Callable


class OutputText:
    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]) -> None:
        self._decode = decode
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._prefix = 0  # output tokens from here on are decoded (context, then new)...
        self._read = 0  # ...and those from here on are not in ``text`` yet
        self.text = ""
        self.sent = 0  # characters of ``text`` handed out

    def update(self, output_ids: list[int], final: bool = False) -> bool:
        """Take in the outputs so far (``final``: the last time, a partial character
        included); True when a stop string ended the text."""
        context = self._decode(output_ids[self._prefix : self._read]) if self._read else ""
        decoded = self._decode(output_ids[self._prefix :])
        if (decoded.endswith("\ufffd") and not final) or len(decoded) <= len(context):
            return False
        searched = max(0, len(self.text) - self._hold)
        text = self.text + decoded[len(context) :]
        self._prefix, self._read = self._read, len(output_ids)
        hits = [i for i in (text.find(s, searched) for s in self._stop) if i >= 0]
        if hits:
            self.text = text[: min(hits)]
            return True
        self.text = text
        return False

    def take(self, final: bool) -> str:
        """The text not handed out yet (less what is held back unless ``final``)."""
        end = len(self.text) if final else max(self.sent, len(self.text) - self._hold)
        new = self.text[self.sent : end]
        self.sent = end
        return new
