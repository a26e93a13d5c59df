"""Split long documents into passages by token windows.

Dense encoders read a bounded window (all-MiniLM-L6-v2: 256 word pieces). A document
whose body fits is one passage with the document's own doc_id; a longer one becomes
passages ``"<doc_id>#p0"``, ``"#p1"``, ... of ``max_tokens`` tokens that overlap by
``overlap`` tokens. Fetching a URL always returns the whole document.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from drgym.errors import ConfigError
from drgym.types import Document

TITLE_ROOM = 32
"""Tokens of the encoder window kept for the title and special tokens."""


def default_max_tokens(encoder_max_length: int) -> int:
    """Default body window for an encoder: its window minus :data:`TITLE_ROOM`
    (224 tokens for all-MiniLM-L6-v2's 256), so title + body fit untruncated."""
    return max(16, int(encoder_max_length) - TITLE_ROOM)


@dataclass(frozen=True)
class Passage:
    """A unit of retrieval.

    Attributes:
        passage_id: ``doc_id`` when the document is not split, else ``"<doc_id>#p<k>"``.
        doc_id: the parent document.
        title: the parent's title.
        text: the passage's slice of the body text.
    """

    passage_id: str
    doc_id: str
    title: str
    text: str

    @property
    def embed_text(self) -> str:
        """What the encoder reads: ``"title\\ntext"`` (or just text without a title)."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def split_documents(
    docs: Iterable[Document],
    tokenizer=None,
    *,
    max_tokens: int | None = 256,
    overlap: int = 32,
) -> list[Passage]:
    """Split documents into passages.

    Args:
        docs: documents in corpus order.
        tokenizer: a Hugging Face *fast* tokenizer (for offsets); None means
            whitespace words count as tokens.
        max_tokens: window size in tokens of the body (title excluded); None or 0
            disables splitting.
        overlap: tokens shared by consecutive windows, 0 <= overlap < max_tokens.

    Returns:
        Passages in corpus order.

    Raises:
        ConfigError: overlap outside [0, max_tokens).
    """
    if max_tokens and not 0 <= overlap < max_tokens:
        raise ConfigError(f"overlap must be in [0, max_tokens={max_tokens}), got {overlap}.")
    out: list[Passage] = []
    for d in docs:
        if not max_tokens:
            out.append(Passage(d.doc_id, d.doc_id, d.title, d.text))
            continue
        spans = _token_spans(d.text, tokenizer)
        if len(spans) <= max_tokens:
            out.append(Passage(d.doc_id, d.doc_id, d.title, d.text))
            continue
        step = max_tokens - overlap
        k = 0
        for start in range(0, len(spans), step):
            window = spans[start : start + max_tokens]
            text = d.text[window[0][0] : window[-1][1]].strip()
            out.append(Passage(f"{d.doc_id}#p{k}", d.doc_id, d.title, text))
            k += 1
            if start + max_tokens >= len(spans):
                break
    return out


def _token_spans(text: str, tokenizer) -> list[tuple[int, int]]:
    if tokenizer is None:
        return [m.span() for m in re.finditer(r"\S+", text)]
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False, verbose=False)
    return [tuple(o) for o in enc["offset_mapping"]]
