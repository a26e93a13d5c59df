"""URL helpers: Wikipedia URLs from titles, and URL normalisation for lookups."""

from __future__ import annotations

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
