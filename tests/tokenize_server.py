"""vLLM's ``POST /tokenize`` contract served on 127.0.0.1 by a real HTTP server, for tests of
the prompt fit against an endpoint tokenizer: it answers ``{"count", "max_model_len"}`` with a
local counter's count of the request's prompt."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextlib.contextmanager
def tokenize_server(
    count: Callable[[str], int],
    max_model_len: int,
    on_request: Callable[[dict[str, Any]], None] | None = None,
    *,
    drop_reused_every: int | None = None,
    connections: list[int] | None = None,
) -> Iterator[str]:
    """The server's base URL while the block runs; ``on_request`` sees each request's body.

    ``drop_reused_every=k``: HTTP/1.1 keep-alive, and every k-th request on one connection is
    read and then dropped unanswered (as llama-server drops some reused connections);
    ``connections`` gets, per connection, how many requests it carried."""

    class Handler(BaseHTTPRequestHandler):
        if drop_reused_every is not None:
            protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            self.served = 0

        def finish(self):
            super().finish()
            if connections is not None:
                connections.append(self.served)

        def do_POST(self):  # noqa: N802 (http.server's naming)
            data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.served += 1
            if drop_reused_every is not None and self.served % drop_reused_every == 0:
                self.close_connection = True
                return
            if on_request is not None:
                on_request(data)
            out = json.dumps({"count": count(data["prompt"]), "max_model_len": max_model_len})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
