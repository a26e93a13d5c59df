"""FACT: citation accuracy and effective citations (DeepResearch Bench).

Source: DeepResearch Bench (Du et al., arXiv 2506.11763, §3.2 "FACT"); upstream
``Ayanami0730/deep_research_bench`` ``utils/extract.py``, ``deduplicate.py``,
``scrape.py``, ``validate.py``, ``stat.py``.

Pipeline per report:

1. Extract ``(fact, ref_idx, url)`` triplets from *inline* citations (one judge call).
   A report with only an end-of-report reference list yields no triplets (by design).
2. Deduplicate statements per URL. Upstream asks an LLM which statements of a URL are
   exact duplicates; drgym removes statements that are equal after lower-casing and
   collapsing white space (deterministic, no judge call).
3. Fetch each URL through a :class:`~drgym.search.base.SearchBackend` (upstream: Jina
   Reader on the live web). A URL that cannot be fetched has all its statements
   ``unknown`` without a judge call (upstream judges the "scrape failed" text, which
   the prompt maps to unknown).
4. One judge call per URL with the page and its numbered statements:
   supported / unsupported / unknown per statement. An answer that misses a statement
   is a ``validate_error`` for that URL (retried, then the URL is skipped and counted).
5. Statistics over tasks with at least one extracted citation (N), ``unknown`` and
   errored URLs excluded: citation accuracy = sum supported / sum judged (micro,
   confirmed by the maintainers in issue #11); effective citations = sum supported / N;
   total citations = sum judged / N.

The reward's score is the report's own accuracy (supported / judged; 0 when nothing
could be judged, so bibliography-only reports get 0 as in the benchmark).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from drgym.rewards.citation import strip_urls

from drgym.errors import ConfigError, DrgymError, ServiceUnavailableError
from drgym.judges.base import Judge, JudgeRequest
from drgym.judges.factory import require_judge
from drgym.judges.prompts import FACT_EXTRACT, FACT_VALIDATE
from drgym.records import Episode, Reward, RewardOutput
from drgym.search.base import SearchBackend
from drgym.search.pages import URL_ERRORS

log = logging.getLogger(__name__)


def dedupe_per_url(citations: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Group ``{"fact", "url"}`` items by URL and drop repeated statements (case/space-insensitive).

    Returns:
        ``{url: [fact, ...]}`` in first-seen order.
    """
    out: dict[str, list[str]] = {}
    seen: dict[str, set[str]] = {}
    for c in citations:
        url = str(c.get("url") or "").strip()
        fact = str(c.get("fact") or "").strip()
        if not url or not fact:
            continue
        key = " ".join(fact.lower().split())
        if key in seen.setdefault(url, set()):
            continue
        seen[url].add(key)
        out.setdefault(url, []).append(fact)
    return out


@dataclass
class FactTask:
    """FACT outcome of one report.

    Attributes:
        n_extracted: triplets extracted (before dedupe); 0 = no inline citations.
        results: ``{url: [label per statement]}`` for URLs judged without error.
        errors: ``{url: reason}`` for URLs skipped (fetch failed -> all unknown is *not*
            an error; a judge failure is).
        failed: the extraction call itself failed.
    """

    n_extracted: int = 0
    results: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    failed: bool = False

    @property
    def supported(self) -> int:
        return sum(r.count("supported") for r in self.results.values())

    @property
    def judged(self) -> int:
        """Statements judged supported or unsupported (unknown excluded)."""
        return sum(r.count("supported") + r.count("unsupported") for r in self.results.values())

    @property
    def unknown(self) -> int:
        return sum(r.count("unknown") for r in self.results.values())


def fact_stats(tasks: list[FactTask] | list[dict[str, int]]) -> dict[str, float]:
    """Benchmark-level FACT statistics (upstream ``utils/stat.py``).

    Args:
        tasks: :class:`FactTask` objects, or dicts with ``n_extracted``, ``supported``,
            ``judged``; failed extractions are dropped, as upstream.

    Returns:
        ``{"citation_accuracy", "effective_citations", "total_citations", "n_tasks"}``;
        accuracy is None when nothing was judged.

    Raises:
        ConfigError: no task with citations.
    """
    rows = []
    for t in tasks:
        if isinstance(t, FactTask):
            if t.failed:
                continue
            rows.append({"n_extracted": t.n_extracted, "supported": t.supported, "judged": t.judged})
        else:
            rows.append(t)
    rows = [r for r in rows if r["n_extracted"] > 0]
    if not rows:
        raise ConfigError("fact_stats needs at least one task with extracted citations.")
    n = len(rows)
    sup = sum(r["supported"] for r in rows)
    jud = sum(r["judged"] for r in rows)
    return {
        "citation_accuracy": sup / jud if jud else None,
        "effective_citations": sup / n,
        "total_citations": jud / n,
        "n_tasks": n,
    }


class FactReward(Reward):
    """FACT citation accuracy of a report, in [0, 1].

    Args:
        judge: judge or spec.
        backend: :class:`SearchBackend` whose ``fetch(url)`` returns cited pages.
        max_urls: at most this many URLs are validated per report.
        max_page_chars: each fetched page is cut to this many characters.
        max_article_chars: the article is cut to this many characters for extraction.

    Components: ``fact_accuracy``, ``fact_supported`` (= effective citations of the
    report), ``fact_judged``, ``fact_unknown``, ``fact_n_extracted``, ``fact_url_errors``.
    A failed extraction gives None (counted in ``failures``); errored URLs are excluded
    and counted in ``fact_url_errors``.
    """

    name = "fact"

    def __init__(
        self,
        judge: Judge | str | None = None,
        backend: SearchBackend | None = None,
        *,
        max_urls: int = 100,
        max_page_chars: int = 8000,
        max_article_chars: int = 40000,
    ) -> None:
        self.judge = require_judge(judge, self.name)
        if backend is None:
            raise ConfigError("FACT fetches cited pages: pass backend=<SearchBackend>.")
        self.backend = backend
        self.max_urls = int(max_urls)
        self.max_page_chars = int(max_page_chars)
        self.max_article_chars = int(max_article_chars)

    def _page(self, url: str) -> str | None:
        """The cited page's text, cut to ``max_page_chars``; None when it cannot be
        fetched (a drgym error, a URL the backend's HTTP library cannot parse or send:
        :data:`~drgym.search.pages.URL_ERRORS`), so its statements are ``unknown``.

        Raises:
            ServiceUnavailableError: the search server is down (no score; the run stops).
        """
        try:
            doc = self.backend.fetch(url)
        except ServiceUnavailableError:
            raise  # the search server is down: no score, the run stops (not a page that failed)
        except (DrgymError, KeyError, OSError, *URL_ERRORS) as e:
            log.info("FACT: %s cannot be fetched (%s: %s); its statements are unknown", url, type(e).__name__, e)
            return None
        text = strip_urls(f"{doc.title}\n{doc.text}").strip()
        return text[: self.max_page_chars] if text else None

    def evaluate(self, episodes: list[Episode]) -> list[FactTask]:
        """Run the FACT pipeline on each report; one :class:`FactTask` each."""
        out = [FactTask() for _ in episodes]
        ext_reqs, ext_idx = [], []
        for i, ep in enumerate(episodes):
            if (ep.answer or "").strip():
                ext_reqs.append(JudgeRequest(FACT_EXTRACT, {"article": ep.answer[: self.max_article_chars]}))
                ext_idx.append(i)
        val_reqs, val_where = [], []
        for i, res in zip(ext_idx, self.judge.judge_many(ext_reqs)):
            if not res.ok:
                out[i].failed = True
                continue
            cits = [c.model_dump() for c in res.verdict.citations]
            out[i].n_extracted = len(cits)
            for url, facts in list(dedupe_per_url(cits).items())[: self.max_urls]:
                page = self._page(url)
                if page is None:
                    out[i].results[url] = ["unknown"] * len(facts)
                    continue
                stmts = "\n".join(f"{k}. {f}" for k, f in enumerate(facts, 1))
                val_reqs.append(JudgeRequest(FACT_VALIDATE, {"page": page, "statements": stmts}))
                val_where.append((i, url, len(facts)))
        for (i, url, nf), res in zip(val_where, self.judge.judge_many(val_reqs)):
            if not res.ok:
                out[i].errors[url] = res.error or "failed"
                continue
            by_idx = {r.idx: r.result for r in res.verdict.results}
            labels = [by_idx.get(k) for k in range(1, nf + 1)]
            if any(lab is None for lab in labels):
                out[i].errors[url] = f"validation returned {len(by_idx)} of {nf} statements"
                continue
            out[i].results[url] = labels
        return out

    def score(self, episodes: list[Episode]) -> RewardOutput:
        tasks = self.evaluate(episodes)
        keys = ("fact_accuracy", "fact_supported", "fact_judged", "fact_unknown", "fact_n_extracted", "fact_url_errors")
        comp: dict[str, list[float | None]] = {k: [] for k in keys}
        scores: list[float | None] = []
        failures = 0
        for t in tasks:
            if t.failed:
                failures += 1
                scores.append(None)
                for k in keys:
                    comp[k].append(None)
                continue
            acc = t.supported / t.judged if t.judged else 0.0
            scores.append(acc)
            for k, v in zip(keys, (acc, t.supported, t.judged, t.unknown, t.n_extracted, len(t.errors))):
                comp[k].append(float(v))
        return RewardOutput(scores=scores, components=comp, failures=failures)
