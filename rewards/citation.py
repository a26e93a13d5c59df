"""Citation precision and recall of a cited report (DeepResearchGym).

Source: DeepResearchGym (Coelho et al., arXiv 2505.19253, §3.2 "Retrieval faithfulness");
upstream ``eval_citation_async.py`` / ``eval_citation_clueweb_async.py`` (precision) and
``eval_citation_recall_async.py`` (recall).

- A report with no URL (``https?://\\S+`` or ``www.\\S+``) scores 0 for both, with no
  judge call.
- One extraction call lists the report's claims with the URLs cited for each (upstream
  uses two extraction prompts, one for precision and one for recall; drgym uses one
  that returns every claim with its possibly empty URL list, which serves both).
- **Precision**: for each claim that cites URLs, each cited page is fetched through a
  :class:`~drgym.search.base.SearchBackend` (the local ``/fetch`` by default, as in the
  upstream ClueWeb variant, so training never touches the live web), URLs are stripped
  from the page text, and one judge call rates support as full / partial / no
  (1 / 0.5 / 0). A claim none of whose pages could be fetched scores 0 without a judge
  call (upstream judges the error string, which comes out as no support) and is counted
  in ``cite_fetch_failed``. Report precision = mean over cited claims (0 when none).
- **Recall**: share of claims citing at least one URL (0 when no claims).

Always read the two together: recall alone rewards URL spamming.
"""

from __future__ import annotations

from typing import Any

from drgym.corpus.urls import find_urls, strip_urls
from drgym.errors import ConfigError, DrgymError, ServiceUnavailableError
from drgym.judges.base import Judge, JudgeRequest
from drgym.judges.factory import require_judge
from drgym.judges.prompts import CITATION_SUPPORT, CLAIM_EXTRACT, SUPPORT_VALUE
from drgym.records import Episode, Reward, RewardOutput
from drgym.search.base import SearchBackend

MODES = ("precision", "recall", "f1", "mean")


class CitationReward(Reward):
    """Citation precision and recall; the score is chosen by ``mode``.

    Args:
        judge: judge or spec (required: ``ConfigError`` without one).
        backend: the :class:`SearchBackend` whose ``fetch(url)`` returns cited pages;
            required unless ``mode == "recall"``.
        mode: ``"precision"`` (default), ``"recall"``, ``"f1"`` (harmonic mean) or ``"mean"``.
        max_claims: at most this many cited claims are judged per report (cost bound).
        max_page_chars: each fetched page is cut to this many characters.
        max_report_chars: the report is cut to this many characters for extraction.

    Components (fractions 0-1): ``citation_precision``, ``citation_recall``,
    ``n_claims``, ``n_cited_claims``, ``cite_fetch_failed``, ``cite_judge_failed``.
    A failed extraction, or any failed support verdict, makes the episode None
    (counted in ``failures``).

    Example (a scripted judge and a one-page backend):
        >>> from drgym.judges.base import Judge
        >>> from drgym.records import Episode, Task
        >>> from drgym.search.base import SearchBackend
        >>> from drgym.types import Document
        >>> class Scripted(Judge):
        ...     model_id = "scripted:citation"
        ...     def complete(self, messages, *, template=None, **kw):
        ...         if template.name == "claim_extract":
        ...             return ('{"claims": [{"claim": "The sky is blue.", "sources": ["https://a.org/sky"]},'
        ...                     ' {"claim": "Sunsets are red.", "sources": []}]}')
        ...         return '{"support": "full_support", "justification": "stated"}'
        >>> class Pages(SearchBackend):
        ...     name = "pages"
        ...     def search_batch(self, queries, k=10):
        ...         return [[] for _ in queries]
        ...     def fetch(self, url):
        ...         return Document(doc_id="sky", url=url, title="Sky", text="The sky is blue.")
        >>> task = Task(task_id="r", question="Why is the sky blue?", kind="research")
        >>> report = "The sky is blue (https://a.org/sky). Sunsets are red."
        >>> out = CitationReward(Scripted(cache=False), Pages()).score([Episode(task, report)])
        >>> out.scores, out.components["citation_precision"], out.components["citation_recall"]
        ([1.0], [1.0], [0.5])
    """

    name = "citation"

    def __init__(
        self,
        judge: Judge | str | None = None,
        backend: SearchBackend | None = None,
        *,
        mode: str = "precision",
        max_claims: int = 50,
        max_page_chars: int = 6000,
        max_report_chars: int = 30000,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"citation mode must be one of {MODES}, got {mode!r}.")
        if backend is None and mode != "recall":
            raise ConfigError("Citation precision fetches cited pages: pass backend=<SearchBackend> (or mode='recall').")
        self.judge = require_judge(judge, self.name)
        self.backend = backend
        self.mode = mode
        self.max_claims = int(max_claims)
        self.max_page_chars = int(max_page_chars)
        self.max_report_chars = int(max_report_chars)

    def _fetch(self, url: str, pages: dict[str, str | None]) -> str | None:
        if url not in pages:
            try:
                doc = self.backend.fetch(url)
                pages[url] = strip_urls(f"{doc.title}\n{doc.text}")[: self.max_page_chars]
            except ServiceUnavailableError:
                raise  # the search server is down: no score, the run stops (not a page that failed)
            except (DrgymError, KeyError, OSError):
                pages[url] = None
        return pages[url]

    def score(self, episodes: list[Episode]) -> RewardOutput:
        n = len(episodes)
        prec: list[float | None] = [None] * n
        rec: list[float | None] = [None] * n
        comp: dict[str, list[Any]] = {k: [0.0] * n for k in ("n_claims", "n_cited_claims", "cite_fetch_failed", "cite_judge_failed")}
        failed = [False] * n
        ext_reqs, ext_idx = [], []
        for i, ep in enumerate(episodes):
            if not find_urls(ep.answer or ""):
                prec[i], rec[i] = 0.0, 0.0
                continue
            ext_reqs.append(JudgeRequest(CLAIM_EXTRACT, {"report": (ep.answer or "")[: self.max_report_chars]}))
            ext_idx.append(i)
        sup_reqs: list[JudgeRequest] = []
        sup_idx: list[int] = []
        per_claim: dict[int, list[float]] = {}
        pages: dict[str, str | None] = {}
        for i, res in zip(ext_idx, self.judge.judge_many(ext_reqs)):
            if not res.ok:
                failed[i] = True
                continue
            claims = res.verdict.claims
            cited = [c for c in claims if any(s.strip() for s in c.sources)]
            comp["n_claims"][i] = float(len(claims))
            comp["n_cited_claims"][i] = float(len(cited))
            rec[i] = len(cited) / len(claims) if claims else 0.0
            per_claim[i] = []
            if self.mode == "recall":
                continue
            for c in cited[: self.max_claims]:
                texts = []
                for u in c.sources:
                    page = self._fetch(next(iter(find_urls(u)), u.strip()), pages)
                    if page is not None:
                        texts.append(page)
                if not texts:
                    comp["cite_fetch_failed"][i] += 1
                    per_claim[i].append(0.0)
                    continue
                cits = "\n\n".join(f"[{k}] {t}" for k, t in enumerate(texts, 1))
                sup_reqs.append(JudgeRequest(CITATION_SUPPORT, {"claim": c.claim, "citations": cits}))
                sup_idx.append(i)
        for i, res in zip(sup_idx, self.judge.judge_many(sup_reqs)):
            if res.ok:
                per_claim[i].append(res.mean(lambda v: SUPPORT_VALUE[v.support]))
            else:
                comp["cite_judge_failed"][i] += 1
                failed[i] = True
        if self.mode != "recall":
            for i, vals in per_claim.items():
                prec[i] = sum(vals) / len(vals) if vals else 0.0
        scores: list[float | None] = []
        failures = 0
        for i in range(n):
            if failed[i]:
                failures += 1
                prec[i] = rec[i] = None
                scores.append(None)
                continue
            p, r = prec[i], rec[i]
            if self.mode == "precision":
                scores.append(p)
            elif self.mode == "recall":
                scores.append(r)
            elif self.mode == "f1":
                scores.append(0.0 if not (p or r) else 2 * p * r / (p + r))
            else:
                scores.append((p + r) / 2)
        return RewardOutput(scores=scores, components={"citation_precision": prec, "citation_recall": rec, **comp}, failures=failures)
