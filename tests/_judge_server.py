"""A deterministic OpenAI-compatible judge, run as a subprocess by tests/test_faults.py
(so that it can be killed with SIGKILL and restarted on the same port).

Usage: ``python tests/_judge_server.py PORT DELAY_S REQUEST_LOG``

``POST /v1/chat/completions`` answers ``{"score": n}`` with ``n = sha256(messages) % 11``
(the same request always gets the same verdict) after ``DELAY_S`` seconds, and appends
one line to ``REQUEST_LOG`` when a request arrives; ``GET /health`` answers ``ok``.
Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    port, delay_s, log_path = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def _send(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self):
            self._send(200, b'"ok"')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(body["messages"][-1]["content"][:60].replace("\n", " ") + "\n")
            time.sleep(delay_s)
            digest = hashlib.sha256(json.dumps(body["messages"], sort_keys=True).encode()).digest()
            content = json.dumps({"score": digest[0] % 11})
            self._send(200, json.dumps({"id": "x", "object": "chat.completion", "model": body.get("model"),
                                        "choices": [{"index": 0, "finish_reason": "stop",
                                                     "message": {"role": "assistant", "content": content}}]}).encode())

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
