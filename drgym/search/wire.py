"""Wire formats of the drgym search service: settings, request/response models, and the
base64 document encoding of DeepResearchGym.

Two public APIs are mirrored so existing agent code can point at drgym unchanged:

* DeepResearchGym (arXiv 2505.19253, server ``large-scale-embeddings/search_api/
  uni_search_srv.py``): ``GET /search`` answers ``{"results": [base64(JSON doc)],
  "distances": [float] | null, "outlinks": [...]}``; ``GET /fetch`` answers
  ``{"clean_text": base64(JSON doc)}``. A decoded document is a ClueWeb22 record
  (``URL``, ``ClueWeb22-ID``, ``Clean-Text`` whose first line is the title) or a FineWeb
  row (``url``, ``id``, ``text``); drgym emits both key styles plus ``title``.
* Search-R1 (arXiv 2503.09516, ``search_r1/search/retrieval_server.py``): ``POST
  /retrieve`` with ``{"queries", "topk", "return_scores"}`` answers ``{"result": [[hit,
  ...] per query]}`` where a hit is ``{"document": {"id", "contents"}, "score"}`` (or the
  bare document without scores); ``contents`` is ``'"title"\\ntext'``.
"""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from drgym.config import Collapse, ServeSettings  # Collapse: the values of ``collapse`` on the wire
from drgym.types import Document, SearchResult


class ServerSettings(BaseSettings, ServeSettings):
    """Settings of ``drgym serve`` (the fields and their meaning:
    :class:`~drgym.config.ServeSettings`); every field can be set by a ``DRGYM_<FIELD>``
    env var (e.g. ``DRGYM_PORT=9000``, ``DRGYM_API_KEYS=k1,k2``) or a CLI option of the
    same name. Other ``DRGYM_*`` variables are ignored.

    Raises:
        pydantic.ValidationError: a value of the wrong type or out of range (from an
            argument or a variable); ``drgym serve`` and ``drgym mcp`` print it as one line.
    """

    model_config = SettingsConfigDict(env_prefix="DRGYM_", extra="ignore")


# -- DeepResearchGym document encoding --------------------------------------------------


def clean_text(title: str, text: str) -> str:
    """ClueWeb22 ``Clean-Text``: the title as first line, then the text (no title: text)."""
    return f"{title}\n{text}" if title else text


def result_record(r: SearchResult) -> dict[str, Any]:
    """JSON document of one search hit, with both DeepResearchGym key styles.

    Returns:
        ``{"URL", "ClueWeb22-ID", "Clean-Text", "url", "id", "title", "text", "source"}``;
        ``text`` is the passage, ``Clean-Text`` is ``title\\npassage``.
    """
    return {
        "URL": r.url,
        "ClueWeb22-ID": r.doc_id,
        "Clean-Text": clean_text(r.title, r.text),
        "url": r.url,
        "id": r.doc_id,
        "title": r.title,
        "text": r.text,
        "source": r.source,
    }


def document_record(d: Document) -> dict[str, Any]:
    """JSON document of a whole fetched document (same keys as :func:`result_record`)."""
    return {
        "URL": d.url,
        "ClueWeb22-ID": d.doc_id,
        "Clean-Text": clean_text(d.title, d.text),
        "url": d.url,
        "id": d.doc_id,
        "title": d.title,
        "text": d.text,
        "source": d.source,
    }


def b64_json(record: dict[str, Any]) -> str:
    """Base64 (standard alphabet, ASCII) of the UTF-8 JSON of ``record``."""
    return base64.b64encode(json.dumps(record, ensure_ascii=False).encode("utf-8")).decode("ascii")


def decode_b64_json(s: str) -> dict[str, Any] | None:
    """Inverse of :func:`b64_json`.

    Returns:
        The decoded object, or None for an empty entry (DeepResearchGym encodes a missing
        document as base64 of ``b""``).

    Raises:
        ValueError: ``s`` is not base64 of a UTF-8 JSON object.
    """
    raw = base64.b64decode(s, validate=True)
    if not raw.strip():
        return None
    obj = json.loads(raw.decode("utf-8"))
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


# -- response / request models ----------------------------------------------------------


class PartialInfo(BaseModel):
    """Present in an answer only when some index shards did not answer (sharded serving,
    :mod:`drgym.distributed.serve`): the hits are the best of the other shards."""

    missing_shards: list[int] = Field(description="shards that did not answer")
    shards: int = Field(description="shards of the index")


def partial_info(hit_lists) -> PartialInfo | None:
    """The :class:`PartialInfo` of result lists, or None when every shard answered."""
    missing: set[int] = set()
    n = 0
    for hits in hit_lists:
        if getattr(hits, "partial", False):
            missing.update(hits.missing_shards)
            n = max(n, hits.n_shards)
    return PartialInfo(missing_shards=sorted(missing), shards=n) if n else None


_PARTIAL = dict(default=None, exclude_if=lambda v: v is None,
                description="only when some index shards did not answer: which ones (the hits come from the others)")


class SearchResponse(BaseModel):
    """``GET /search`` answer (DeepResearchGym shape)."""

    results: list[str] = Field(description="base64 of one JSON document per hit, best first")
    distances: list[float] | None = Field(
        None, description="score per hit (higher is better) when with_distance=true, else null"
    )
    outlinks: list[str] | None = Field(default_factory=list, description="always empty: drgym keeps no outlinks")
    partial: PartialInfo | None = Field(**_PARTIAL)


class FetchResponse(BaseModel):
    """``GET /fetch`` answer (DeepResearchGym shape)."""

    clean_text: str = Field(description="base64 of the JSON of the whole document")


def _json_integer(v: Any) -> Any:
    """A JSON number with no fraction (``3`` or ``3.0``, as JSON Schema's ``integer``); not
    ``"3"`` nor ``true``, which lax pydantic would turn into ints."""
    if isinstance(v, (str, bool)):
        raise ValueError("must be a JSON integer, not a string or boolean")
    return v


JsonInt = Annotated[int, BeforeValidator(_json_integer)]


class RetrieveRequest(BaseModel):
    """``POST /retrieve`` body: Search-R1's ``QueryRequest`` plus ``collapse``.

    As Search-R1's server, ``topk`` null, missing or 0 means the server default, and an
    empty or whitespace query gets an empty result list (Search-R1 rollouts send ``""``
    when a model writes ``<search> </search>``). Types follow the JSON schema: ``"3"``
    and ``true`` are not a topk (``3.0`` is), ``1`` is not a boolean.
    """

    queries: list[str] = Field(description="queries; an empty or whitespace one gets []")
    topk: JsonInt | None = Field(None, description="results per query; null or 0 = the server default")
    return_scores: bool = Field(False, strict=True, description="hits as {document, score} instead of bare documents")
    collapse: Collapse | None = Field(
        None, description="document: distinct documents (best passage each); passage: best passages; null: the server default")


def retrieve_request_model(max_k: int, max_queries: int) -> type[RetrieveRequest]:
    """:class:`RetrieveRequest` whose JSON schema states this server's limits (``topk`` in
    0..max_k, at most ``max_queries`` queries), so schema-driven clients and fuzzers know
    them. The limits are checked by the endpoint (400 naming the limit), not by pydantic."""
    return create_model(
        "RetrieveRequest", __base__=RetrieveRequest, __doc__=RetrieveRequest.__doc__,
        queries=(list[str], Field(description=RetrieveRequest.model_fields["queries"].description,
                                  json_schema_extra={"maxItems": max_queries})),
        topk=(JsonInt | None, Field(None, description=RetrieveRequest.model_fields["topk"].description,
                                json_schema_extra={"minimum": 0, "maximum": max_k})),
    )


class RetrieveDocument(BaseModel):
    """A corpus row in Search-R1's format, plus the ``url``, ``title`` and ``source``
    drgym adds (extra keys Search-R1 code ignores)."""

    id: str
    contents: str = Field(description='"title"\\ntext (FlashRAG / Search-R1 format)')
    url: str = ""
    title: str = ""
    source: str = ""


class RetrieveHit(BaseModel):
    """A scored hit of ``/retrieve`` when ``return_scores`` is true."""

    document: RetrieveDocument
    score: float


class RetrieveResponse(BaseModel):
    """``POST /retrieve`` answer: one list per query, in the order of the queries."""

    result: list[list[RetrieveHit]] | list[list[RetrieveDocument]]
    partial: PartialInfo | None = Field(**_PARTIAL)


class HealthResponse(BaseModel):
    """``GET /health`` answer; ``service == "drgym"`` tells clients they can use
    ``/retrieve`` for batches."""

    status: str = "healthy"
    service: str = "drgym"
    version: str
    backend: str
    index: str = Field("", description="what is served, e.g. LocalSearchEngine('wiki-default--...', method='hybrid', ...)")
    deterministic: bool
    max_k: int
    collapse: Collapse | None = Field(None, description="default of /search; null: the backend cannot collapse (its own results)")
    retrieve_collapse: Collapse | None = Field(None, description="default of /retrieve (null as above)")
    engine: dict[str, Any] = Field(default_factory=dict, description=(
        "the served backend's identity (SearchBackend.identity, no secrets): for a local index its name, "
        "manifest_fingerprint, corpus_fingerprint, passages, method, encoder, max_k and ranking settings; "
        "clients record it and refuse to resume a run against another engine"))
    stats: dict[str, int | float] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    """Every error answer: ``{"detail": message}``."""

    detail: Any


def retrieve_document(r: SearchResult) -> RetrieveDocument:
    """Search-R1 corpus row of a hit."""
    return RetrieveDocument(id=r.doc_id, contents=f'"{r.title}"\n{r.text}', url=r.url, title=r.title, source=r.source)
