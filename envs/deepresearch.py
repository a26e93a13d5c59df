"""``drgym/DeepResearch-v0``: write a cited report by searching and fetching."""

from __future__ import annotations

import re
from typing import Any

from drgym.envs.core import SearchAgentEnv
from drgym.envs.prompts import format_docs

from drgym.corpus.urls import URL_RE
from drgym.records import Task, ToolCall, Trajectory

_MARKER_RE = re.compile(r"\[(\d+(?:\s*[,;–-]\s*\d+)*)\]")
_SPACE_PUNCT_RE = re.compile(r"\s+([.,;:!?。，！？])")
_BIB_LINE_RE = re.compile(r"^\s*(?:\[(\d+)\]|(\d+)\.)\s*(.*)$")
_SENT_RE = re.compile(r"(?<=[.!?。！？])\s+|\n+")


def _marker_numbers(inner: str) -> list[int]:
    out: list[int] = []
    for part in re.split(r"\s*[,;]\s*", inner):
        m = re.match(r"^(\d+)\s*[–-]\s*(\d+)$", part)
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            if 0 < b - a < 50:
                out.extend(range(a, b + 1))
                continue
        if part.strip().isdigit():
            out.append(int(part))
    return out


def extract_citations(report: str, sources: dict[int, str]) -> list[dict[str, Any]]:
    """Split a report into claims with the URLs they cite inline.

    A claim is a sentence (split after ``.!?`` and on newlines). Its citations are the
    ``[n]`` markers (``[1, 3]`` and ``[2-4]`` too) resolved through ``sources`` (the env's
    global source numbering, overridden by a bibliography line ``[n] <url>`` or
    ``n. <url>`` in the report) plus any URL written in the sentence. Bibliography lines
    themselves are not claims, so a bibliography-only report yields claims with no URLs.

    Args:
        report: the report text.
        sources: source number -> URL, as shown to the agent.

    Returns:
        One ``{"claim": str, "urls": list[str], "markers": list[int]}`` per sentence
        with text, in order; ``urls`` keeps the citation order without duplicates.
        Markers that resolve to nothing are kept in ``markers`` only.
    """
    mapping = dict(sources)
    body_lines = []
    for line in report.splitlines():
        m = _BIB_LINE_RE.match(line)
        urls = URL_RE.findall(line)
        if m and urls and len(line.strip()) - len(urls[0]) < 200 and line.strip().startswith(("[", m.group(2) or "\0")):
            n = int(m.group(1) or m.group(2))
            mapping[n] = urls[0]
            continue
        body_lines.append(line)
    claims = []
    for sent in _SENT_RE.split("\n".join(body_lines)):
        if not sent or not sent.strip():
            continue
        markers = [n for m in _MARKER_RE.finditer(sent) for n in _marker_numbers(m.group(1))]
        urls: list[str] = []
        for n in markers:
            u = mapping.get(n)
            if u and u not in urls:
                urls.append(u)
        for u in URL_RE.findall(sent):
            if u not in urls:
                urls.append(u)
        text = _SPACE_PUNCT_RE.sub(r"\1", URL_RE.sub("", _MARKER_RE.sub("", sent))).strip()
        if text:
            claims.append({"claim": text, "urls": urls, "markers": markers})
    return claims


def resolve_markers(report: str, sources: dict[int, str]) -> str:
    """Rewrite each resolvable ``[n]`` marker as the markdown link ``[n](url)``.

    Reward modules that look for URLs in the report text (DeepResearchGym's citation
    metrics) then see the sources the agent cited by number. ``[1, 3]`` becomes
    ``[1](u1)[3](u3)``; unknown numbers are left as they are.
    """

    def sub(m: re.Match) -> str:
        nums = _marker_numbers(m.group(1))
        if not nums or any(n not in sources for n in nums):
            return m.group(0)
        return "".join(f"[{n}]({sources[n]})" for n in nums)

    return _MARKER_RE.sub(sub, report)


class DeepResearchEnv(SearchAgentEnv):
    """Long-form research with inline citations: the DeepResearchGym / DeepResearch Bench setting.

    **Description.** Each episode poses one research task (default ``drb-en``: the 40
    English DeepResearch Bench prompts, Du et al. 2025; ``researchy`` gives
    DeepResearchGym's Researchy-Questions with key points, Coelho et al. 2025). The agent
    searches and fetches, then ends with a report in ``<answer>...</answer>`` (or the
    ``answer`` tool). Every source shown gets a global number ``[n]`` for the episode;
    the report cites claims inline with ``[n]`` or URLs. A bibliography-only report is
    legal but earns 0 on citation rewards (the system prompt says so).

    **Action Space / Observation Space / Starting State / Episode End / Information.**
    As :class:`~drgym.envs.searchqa.SearchQAEnv`, except that result items are labelled
    ``[n] (Title: ..., URL: ...)`` with episode-wide numbers. At the end the trajectory's
    ``metadata`` holds ``sources`` (``[{"n", "url", "title"}]``) and ``citations``
    (:func:`extract_citations` of the report). The reward scores the report with its
    ``[n]`` markers rewritten as ``[n](url)`` (:func:`resolve_markers`), so URL-based
    citation rewards see numbered citations; ``final_answer`` keeps the agent's text.

    **Rewards.** 0.0 until the end; then the configured reward (no default that needs no
    judge exists for reports, so the default is ``False``: no reward, 0.0). Pass e.g. a
    key-point-recall or citation reward from :mod:`drgym.rewards`.

    **Arguments.** See :class:`~drgym.envs.core.SearchAgentEnv`. Defaults here:
    ``max_turns=12``, ``max_searches=8``, ``max_fetches=6``, ``max_obs_tokens=1000``,
    ``top_k=5``.

    **Version History.** v0: first version.
    """

    kind = "research"
    default_tasks = "drb-en"
    default_reward = False
    env_id = "drgym/DeepResearch-v0"

    def __init__(self, backend=None, tasks=None, reward=None, **kwargs: Any) -> None:
        for k, v in (("max_turns", 12), ("max_searches", 8), ("max_fetches", 6), ("max_obs_tokens", 1000), ("top_k", 5)):
            kwargs.setdefault(k, v)
        super().__init__(backend, tasks, reward, **kwargs)
        self._sources: dict[str, int] = {}
        self._titles: dict[str, str] = {}

    def _on_reset(self, task: Task) -> None:
        self._sources = {}
        self._titles = {}

    def format_results(self, call: ToolCall, docs: list[dict[str, Any]]) -> tuple[str, bool]:
        """Label each item with its episode-wide source number ``[n]``."""
        labels = []
        for d in docs:
            url = d.get("url", "")
            if url not in self._sources:
                self._sources[url] = len(self._sources) + 1
                self._titles[url] = d.get("title", "")
            labels.append(f"[{self._sources[url]}]")
        return format_docs(docs, self.max_obs_tokens, labels=labels)

    @property
    def sources(self) -> dict[int, str]:
        """Source number -> URL for the current episode."""
        return {n: u for u, n in self._sources.items()}

    def _answer_for_reward(self) -> str:
        """The report with ``[n]`` markers resolved to ``[n](url)`` (see :func:`resolve_markers`)."""
        return resolve_markers(self._final_answer or "", self.sources)

    def _finalize_trajectory(self, traj: Trajectory) -> None:
        traj.metadata["sources"] = [{"n": n, "url": u, "title": self._titles.get(u, "")} for u, n in self._sources.items()]
        traj.metadata["citations"] = extract_citations(traj.final_answer or "", self.sources)
