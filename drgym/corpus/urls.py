"""URL helpers: Wikipedia URLs from titles, and URL normalisation for lookups."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote, urlsplit, urlunsplit


def wikipedia_url(title: str, lang: str = "en") -> str:
    """English Wikipedia URL of a page title.

    >>> wikipedia_url("Lilu (mythology)")
    'https://en.wikipedia.org/wiki/Lilu_(mythology)'
    """
    slug = title.strip().replace(" ", "_")
    return f"https://{lang}.wikipedia.org/wiki/" + quote(slug, safe="()_,'!:*-.~;@$&+=/")


def normalize_url(url: str) -> str:
    """Canonical form of a URL for lenient lookups.

    Lower-cases scheme and host, maps ``http`` to ``https``, drops ``www.`` and the
    Wikipedia mobile ``.m.`` host, percent-decodes the path, turns spaces into
    underscores for Wikipedia, strips a trailing slash and a trailing newline. The
    fragment is kept (it tells apart documents that share a page title).

    >>> normalize_url("http://en.m.wikipedia.org/wiki/Lilu%20(mythology)/")
    'https://en.wikipedia.org/wiki/Lilu_(mythology)'
    """
    url = url.strip()
    parts = urlsplit(url)
    scheme = (parts.scheme or "https").lower()
    if scheme == "http":
        scheme = "https"
    host = parts.netloc.lower()
    if host.startswith("www."):
        host = host[4:]
    if host.endswith("wikipedia.org"):
        host = host.replace(".m.wikipedia.org", ".wikipedia.org")
    path = unquote(parts.path)
    if host.endswith("wikipedia.org"):
        path = path.replace(" ", "_")
    if len(path) > 1 and path.endswith("/"):
        path = path[:-1]
    return urlunsplit((scheme, host, path, parts.query, unquote(parts.fragment)))


DOC_URL_PREFIX = "drgym://doc/"
"""The URL of a document whose corpus gives it none: ``drgym://doc/<doc_id>`` (search
results show it, ``fetch`` takes it, and a report may cite it like any URL)."""

# http(s) and bare www. URLs in free text (as DeepResearchGym's citation regex), and the
# ``drgym://doc/<doc_id>`` of a document without a URL. Parentheses are kept when balanced (one level), so
# ``https://en.wikipedia.org/wiki/Lilu_(mythology)`` survives while a URL written as
# ``(see https://x.org/a).`` loses the closing ``)`` and the full stop.
URL_RE = re.compile(
    r"(?:https?://|www\.|drgym://doc/)(?:[^\s<>\"'\[\]{}()]|\([^\s()]*\))*(?:[^\s<>\"'\[\]{}().,;:!?*_]|\([^\s()]*\))"
)


def find_urls(text: str) -> list[str]:
    """URLs in ``text``, in order of first appearance, without duplicates.

    Trailing punctuation and markdown (``.,;:!?*_`` and an unbalanced ``)``) are not part
    of a URL; balanced parentheses are.

    >>> find_urls("Lilu [1](https://en.wikipedia.org/wiki/Lilu_(mythology)). See https://x.org/a.")
    ['https://en.wikipedia.org/wiki/Lilu_(mythology)', 'https://x.org/a']
    >>> find_urls("As [2](drgym://doc/17) says.")
    ['drgym://doc/17']
    """
    return list(dict.fromkeys(URL_RE.findall(text or "")))


def strip_urls(text: str) -> str:
    """``text`` with every URL (as found by :func:`find_urls`) removed."""
    return URL_RE.sub("", text or "")
