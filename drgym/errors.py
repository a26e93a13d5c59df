"""The one error hierarchy of drgym.

Messages follow "expected X, got Y" plus the fix, in the manner of Gymnasium's
``error.py``. Callers catch :class:`DrgymError` to handle any drgym failure.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class DrgymError(Exception):
    """Base class of every error drgym raises on purpose."""


class ConfigError(DrgymError, ValueError):
    """A configuration value is invalid (bad name, out-of-range number, wrong type)."""


class CorpusError(DrgymError, ValueError):
    """A corpus file is missing, malformed, or in an unknown format."""


class IndexError_(DrgymError):
    """An index is missing, corrupt, or was built for something else."""


class IndexNotFoundError(IndexError_, FileNotFoundError):
    """No index exists at the expected location."""


class IndexMismatchError(IndexError_, ValueError):
    """The index manifest disagrees with the requested encoder, corpus or format."""


class CorruptIndexError(IndexError_, ValueError):
    """An index file exists but cannot be read (truncated, wrong shape, bad JSON)."""


class IndexReplacedError(CorruptIndexError):
    """The index folder was replaced on disk (``drgym index build --force``) after this
    process loaded it, and a part not yet loaded would come from the new index: restart
    the process (or load the engine again) to serve the new one."""


class SearchError(DrgymError):
    """A search or fetch failed (bad request, remote error, timeout)."""


class BadQueryError(SearchError, ValueError):
    """The query or ``k`` is invalid: empty query, k outside 1..max_k."""


class DocumentNotFoundError(SearchError, KeyError):
    """No document has the requested doc_id or URL."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message plain.
        return str(self.args[0]) if self.args else "document not found"


class BackendUnavailableError(SearchError):
    """A remote backend could not be reached or kept failing after retries."""


class ServiceUnavailableError(BackendUnavailableError):
    """A service a run depends on kept failing after its retries: the search server
    (``drgym serve`` or the DeepResearchGym API, through
    :class:`~drgym.search.client.HTTPSearchClient`), the policy's endpoint or the judge's
    endpoint is unreachable, times out or answers 429/5xx.

    Commercial web search APIs (Serper, Tavily, Brave) keep raising
    :class:`BackendUnavailableError`: a generalisation study records their failures per
    episode as a property of the provider (``drgym compare``'s errors column).

    Unlike a failed query or a missing page (shown to the agent as an observation), this
    ends the run: the rollout runner keeps the finished episodes, records none that saw
    the failure, and says how to resume (rerun the same command once the service is back).
    """


class AuthError(SearchError):
    """A remote backend refused the credentials (HTTP 401/403)."""


class ReplayMissError(SearchError, KeyError):
    """Replay mode found no recording for a request."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no recording"


class JudgeError(DrgymError):
    """A judge could not produce a valid verdict after its retries."""


class DependencyNotInstalled(DrgymError, ImportError):
    """An optional dependency is missing; the message gives the pip command."""


def unknown_name(kind: str, name: str, known: Iterable[str]) -> ConfigError:
    """Build a :class:`ConfigError` for an unknown name, with a "Did you mean" hint.

    Args:
        kind: what was being looked up, e.g. ``"corpus"`` or ``"reward"``.
        name: the name the user gave.
        known: the valid names.

    Returns:
        A ConfigError whose message lists the valid names and the closest match.
    """
    known = sorted(known)
    return ConfigError(f"Unknown {kind} {name!r}.{did_you_mean(name, known)} Known: {', '.join(known)}.")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``" Did you mean 'max_turns'?"`` for the known name closest to ``name``, else ``""``."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
