"""A loopback HTTP server that answers like Serper, Tavily, Brave and plain web pages.

Used by test_web_backends, test_record_replay and test_compare; it listens on
127.0.0.1 only, so no test sends traffic anywhere else.

Routes (the prefix is the provider's base URL in tests):
    POST /serper/search                 Serper: X-API-KEY, {"q","num"} -> {"organic": [...]}
    POST /tavily/search                 Tavily: Bearer key, {"query","max_results"} -> {"results": [...]}
    GET  /brave/res/v1/web/search       Brave: X-Subscription-Token, ?q=&count= -> {"web": {"results": [...]}}
    GET  /drg/search                    DeepResearchGym: x-api-key, ?query=&k= -> {"results": [base64 ClueWeb22 JSON]}
    GET  /pages/<slug>                  an HTML page about <slug> (PAGES, or the pages given), /pages/doc.pdf (PDF),
                                        /pages/huge (large HTML), anything else 404

Failures are scripted with :meth:`FakeProviders.plan`: the next requests to a route get
the given ``(status, headers, body, delay_s)`` answers in order, then normal answers
resume. Every request is logged in :attr:`FakeProviders.requests`.
"""

from __future__ import annotations

import base64
import html
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

API_KEY = "test-key"

#: slug -> (title, main text). Search answers rank pages by word overlap with the query.
PAGES: dict[str, tuple[str, str]] = {
    "paris": ("Paris - capital of France",
              "Paris is the capital and most populous city of France. The Eiffel Tower stands on the Champ de Mars in Paris."),
    "berlin": ("Berlin - capital of Germany",
               "Berlin is the capital and largest city of Germany. The Brandenburg Gate is a landmark of Berlin."),
    "eiffel": ("Eiffel Tower",
               "The Eiffel Tower is a wrought-iron lattice tower in Paris, France, designed by the company of Gustave Eiffel and completed in 1889."),
    "danube": ("Danube river",
               "The Danube is the second-longest river in Europe; it flows through Vienna, Budapest and Belgrade into the Black Sea."),
    "nile": ("Nile river",
             "The Nile is a major river in northeastern Africa that flows into the Mediterranean Sea; Cairo lies on the Nile."),
}


def page_html(slug: str, pages: dict[str, tuple[str, str]] | None = None) -> str:
    """The HTML served for ``slug``: navigation and footer boilerplate around the main text."""
    title, text = (PAGES if pages is None else pages)[slug]
    paras = f"<p>{html.escape(text)}</p>"
    title = html.escape(title)
    return (
        f"<html><head><title>{title}</title></head><body>"
        "<nav><a href='/'>Home</a> | <a href='/about'>About us</a> | <a href='/login'>Log in</a></nav>"
        f"<article><h1>{title}</h1>{paras}</article>"
        "<footer>Copyright 2025 Example Encyclopedia. All rights reserved. Cookie settings.</footer>"
        "</body></html>"
    )


def rank_pages(query: str, k: int) -> list[str]:
    """Slugs of PAGES sorted by how many query words their title+text contain (ties: slug)."""
    words = {w.strip("?,.").lower() for w in query.split() if len(w.strip("?,.")) > 2}
    scored = []
    for slug, (title, text) in PAGES.items():
        body = f"{title} {text}".lower()
        s = sum(1 for w in words if w in body)
        if s:
            scored.append((-s, slug))
    return [slug for _, slug in sorted(scored)][:k]


class FakeProviders:
    """Start with ``with FakeProviders() as fp:``; ``fp.base`` is ``http://127.0.0.1:<port>``."""

    def __init__(self, pages: dict[str, tuple[str, str]] | None = None, ranker=None) -> None:
        """Args: ``pages`` (slug -> (title, text), default :data:`PAGES`) and ``ranker``
        (``(query, k) -> [slug]``, default word overlap :func:`rank_pages`)."""
        self.pages = PAGES if pages is None else pages
        self.ranker = ranker or rank_pages
        self.requests: list[dict] = []
        self._plans: dict[str, list[tuple[int, dict, bytes, float]]] = {}
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # keep pytest output clean
                pass

            def _reply(self, status: int, headers: dict, body: bytes) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _handle(self, method: str) -> None:
                parts = urlsplit(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                route = parts.path
                rec = {"method": method, "path": route, "query": parse_qs(parts.query),
                       "headers": {k.lower(): v for k, v in self.headers.items()}, "body": raw}
                with outer._lock:
                    outer.requests.append(rec)
                    plan = outer._plans.get(route)
                    step = plan.pop(0) if plan else None
                if step is not None:
                    status, headers, body, delay = step
                    if delay:
                        time.sleep(delay)
                    self._reply(status, headers, body)
                    return
                self._reply(*outer._normal(method, route, rec))

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # -- control -------------------------------------------------------------------------
    def plan(self, route: str, *answers: tuple) -> None:
        """Script the next answers of ``route``: each ``(status, headers, body[, delay_s])``;
        ``body`` may be bytes, str or a JSON-able object."""
        out = []
        for a in answers:
            status, headers, body = a[0], dict(a[1]), a[2]
            delay = a[3] if len(a) > 3 else 0.0
            if not isinstance(body, (bytes, str)):
                body = json.dumps(body)
                headers.setdefault("Content-Type", "application/json")
            out.append((status, headers, body.encode() if isinstance(body, str) else body, delay))
        with self._lock:
            self._plans.setdefault(route, []).extend(out)

    def count(self, route: str) -> int:
        """Requests received on ``route`` so far."""
        with self._lock:
            return sum(1 for r in self.requests if r["path"] == route)

    # -- normal answers ------------------------------------------------------------------
    def _normal(self, method: str, route: str, rec: dict) -> tuple[int, dict, bytes]:
        js = {"Content-Type": "application/json"}
        h = rec["headers"]
        if route == "/serper/search" and method == "POST":
            if h.get("x-api-key") != API_KEY:
                return 403, js, b'{"message": "Unauthorized.", "statusCode": 403}'
            body = json.loads(rec["body"])
            slugs = self.ranker(body["q"], int(body.get("num", 10)))
            organic = [{"title": self.pages[s][0], "link": f"{self.base}/pages/{s}", "snippet": self.pages[s][1][:90],
                        "position": i + 1} for i, s in enumerate(slugs)]
            return 200, js, json.dumps({"searchParameters": {"q": body["q"], "type": "search"}, "organic": organic}).encode()
        if route == "/tavily/search" and method == "POST":
            if h.get("authorization") != f"Bearer {API_KEY}":
                return 401, js, b'{"detail": {"error": "Unauthorized: missing or invalid API key."}}'
            body = json.loads(rec["body"])
            slugs = self.ranker(body["query"], int(body.get("max_results", 5)))
            results = [{"title": self.pages[s][0], "url": f"{self.base}/pages/{s}", "content": self.pages[s][1][:90],
                        "score": round(0.9 - 0.1 * i, 3),
                        "raw_content": self.pages[s][1] if body.get("include_raw_content") else None}
                       for i, s in enumerate(slugs)]
            return 200, js, json.dumps({"query": body["query"], "results": results, "response_time": 0.01}).encode()
        if route == "/brave/res/v1/web/search" and method == "GET":
            if h.get("x-subscription-token") != API_KEY:
                return 401, js, b'{"type": "ErrorResponse", "error": {"code": "SUBSCRIPTION_TOKEN_INVALID", "status": 401}}'
            q = rec["query"]["q"][0]
            slugs = self.ranker(q, int(rec["query"].get("count", ["10"])[0]))
            if not slugs:  # Brave omits "web" when nothing matched
                return 200, js, json.dumps({"type": "search", "query": {"original": q}}).encode()
            results = [{"title": self.pages[s][0], "url": f"{self.base}/pages/{s}",
                        "description": self.pages[s][1][:90].replace(self.pages[s][1].split()[0], f"<strong>{self.pages[s][1].split()[0]}</strong>", 1)}
                       for s in slugs]
            return 200, js, json.dumps({"type": "search", "query": {"original": q}, "web": {"type": "search", "results": results}}).encode()
        if route == "/drg/search" and method == "GET":  # DeepResearchGym: x-api-key, base64 ClueWeb22 records
            if h.get("x-api-key") != API_KEY:
                return 401, js, b'{"detail": "Invalid or missing API Key"}'
            q = rec["query"]["query"][0]
            slugs = self.ranker(q, int(rec["query"].get("k", ["10"])[0]))
            docs = [base64.b64encode(json.dumps({
                "URL": f"{self.base}/pages/{s}", "URL-hash": f"hash-{s}", "Language": "en",
                "ClueWeb22-ID": f"clueweb22-en0000-00-{i:05d}", "Clean-Text": f"{self.pages[s][0]}\n{self.pages[s][1]}",
            }).encode()).decode() for i, s in enumerate(slugs)]
            return 200, js, json.dumps({"results": docs, "distances": [-5.0 - i for i in range(len(docs))],
                                        "outlinks": []}).encode()
        if route.startswith("/pages/"):
            slug = route.removeprefix("/pages/")
            if slug in self.pages:
                return 200, {"Content-Type": "text/html; charset=utf-8"}, page_html(slug, self.pages).encode()
            if slug == "doc.pdf":
                return 200, {"Content-Type": "application/pdf"}, b"%PDF-1.4 fake"
            if slug == "huge":
                paras = "".join(f"<p>Paragraph {i} of a very long page about rivers and cities, number {i}.</p>" for i in range(20000))
                return 200, {"Content-Type": "text/html"}, ("<html><body><article>" + paras + "</article></body></html>").encode()
            if slug == "plain.txt":
                return 200, {"Content-Type": "text/plain; charset=utf-8"}, "Just plain text, caf\u00e9.".encode()
        return 404, {"Content-Type": "text/plain"}, b"not found"

    def __enter__(self) -> "FakeProviders":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
