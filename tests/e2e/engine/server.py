"""A stand-in inference engine for the kind e2e test: answers like an OpenAI-style server
(`/health`, `/v1/models`, `/v1/completions`, `/metrics`) without a model or a GPU.

Run as `vllm serve MODEL ... --port N` (the `vllm` shim in this image), as the router (no
arguments: port $PORT or 8000), or directly. Unknown arguments are ignored, so whatever the
operator renders for a real engine starts this one.
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def port_from(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        if arg == "--port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
    return int(os.environ.get("PORT", "8000"))


def model_from(argv: list[str]) -> str:
    # `vllm serve MODEL ...`: the first positional argument after `serve`.
    if len(argv) > 1 and argv[0] == "serve" and not argv[1].startswith("-"):
        return argv[1]
    return "stand-in"


class Handler(BaseHTTPRequestHandler):
    model = "stand-in"

    def do_GET(self) -> None:
        if self.path in ("/health", "/healthz", "/ready"):
            self._send(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        elif self.path == "/metrics":
            body = b"# TYPE standin_up gauge\nstandin_up 1\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._send(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path in ("/v1/completions", "/v1/chat/completions"):
            self._send(
                200,
                {
                    "object": "text_completion",
                    "model": self.model,
                    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                },
            )
        else:
            self._send(404, {"error": f"no route {self.path}"})

    def _send(self, status: int, payload: dict[str, object]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        if not self.path.startswith("/health"):  # probes every few seconds: keep logs readable
            super().log_message(format, *args)


def main(argv: list[str]) -> None:
    Handler.model = model_from(argv)
    port = port_from(argv)
    print(f"stand-in engine serving {Handler.model} on :{port}", flush=True)
    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
