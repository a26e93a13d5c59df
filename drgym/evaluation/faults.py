"""What a rollout run does when a service it depends on goes down.

The rule (used by :func:`drgym.evaluation.runner.run_rollout`):

- every client retries with exponential backoff first (tenacity: the HTTP search client,
  the ``openai:`` policy and the OpenAI-compatible judge), and once a server has answered
  it is waited for (``retry.reconnect_s``, 60 s by default) so that a server killed and
  restarted mid-run costs nothing;
- if it is still down, the client raises :class:`~drgym.errors.ServiceUnavailableError`
  and the run **stops**: the episodes finished before are in ``trajectories.jsonl``
  (each appended whole, :func:`drgym.atomic.append_jsonl`), no episode that saw the
  failure is written (its search results, model turns or judge scores would be wrong), and
  rerunning the same command resumes with the episodes not written. Nothing is lost,
  nothing is written twice.

A failed query or a missing page (:class:`~drgym.errors.BadQueryError`,
:class:`~drgym.errors.DocumentNotFoundError`, a web page that is down) is not a service
failure: the env shows it to the agent, as before. Nor is a commercial web search API
(Serper, Tavily, Brave) that fails: ``drgym compare`` records those failures per episode,
as a property of the provider.

The envs (and :class:`~drgym.envs.driver.BatchedDriver`) turn every backend exception
into an observation; :class:`ServiceWatch` is the backend the runner hands them, which
remembers a service failure so the runner can stop at the next turn or episode end.
"""

from __future__ import annotations

import threading
from typing import Any

from drgym.errors import ServiceUnavailableError
from drgym.search.base import SearchBackend
from drgym.types import Document, SearchResult


class ServiceWatch(SearchBackend):
    """A backend that passes every call to ``inner`` and remembers the first
    :class:`~drgym.errors.ServiceUnavailableError` it raised.

    After a failure every later call raises that failure at once (no second wait through
    the client's retries), and :meth:`check` raises it for the runner.

    Args:
        inner: the real backend (its ``name``, ``deterministic`` and ``max_k`` are shown).

    Attributes:
        failure: the first service failure, or None.
    """

    def __init__(self, inner: SearchBackend) -> None:
        self.inner = inner
        self.failure: ServiceUnavailableError | None = None
        self._lock = threading.Lock()

    @property  # type: ignore[override]
    def name(self) -> str:
        return self.inner.name

    @property  # type: ignore[override]
    def deterministic(self) -> bool:
        return self.inner.deterministic

    @property  # type: ignore[override]
    def max_k(self) -> int:
        return self.inner.max_k

    def _call(self, fn: Any, *args: Any) -> Any:
        if self.failure is not None:
            raise self.failure
        try:
            return fn(*args)
        except ServiceUnavailableError as e:
            with self._lock:
                if self.failure is None:
                    self.failure = e
            raise

    def search_batch(self, queries: list[str], k: int = 10) -> list[list[SearchResult]]:
        return self._call(self.inner.search_batch, queries, k)

    def fetch(self, url: str) -> Document:
        return self._call(self.inner.fetch, url)

    def credentials(self) -> tuple[str, ...]:
        return self.inner.credentials()

    def check(self) -> None:
        """Raise the recorded service failure, if any."""
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        """Nothing: the inner backend belongs to the caller."""


def stopped_message(error: BaseException, *, saved: int, total: int, new: int, path: Any) -> str:
    """The one line a stopped run ends with: the failure, what is saved, how to resume."""
    return (f"{error} -- The run stopped: {saved} of {total} episodes are saved in {path} ({new} in this session); "
            "episodes in progress were not recorded. Rerun the same command to resume once the service is back.")
