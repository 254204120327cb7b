# SPDX-License-Identifier: Apache-2.0
"""A real HTTP server that streams chat completions as vLLM's SSE chunks (test replica).

It stands in for `vllm serve` where a test is about the node's goal lifecycle, not about
vLLM (test/ros/test_node_vllm.py runs the real one): each request streams one word every
``gap_s`` up to its ``max_tokens`` (or ``words``), then ``finish_reason`` and [DONE].
"""

from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import json
import threading
import time


def _handler(gap_s: float, words: int):
    class Sse(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
            count = min(int(body.get('max_tokens', words)), words)
            self.send_response(200)
            self.send_header('Content-Type', 'text/event-stream')
            self.end_headers()
            try:
                for index in range(count):
                    time.sleep(gap_s)
                    self._send({'choices': [{'delta': {'content': f' w{index}'}}]})
                reason = 'length' if count == body.get('max_tokens') else 'stop'
                self._send({'choices': [{'delta': {}, 'finish_reason': reason}]})
                self.wfile.write(b'data: [DONE]\n\n')
                self.wfile.flush()
            except OSError:  # the client closed the stream: how a Kill aborts a request
                pass

        def _send(self, chunk: dict) -> None:
            self.wfile.write(f'data: {json.dumps(chunk)}\n\n'.encode())
            self.wfile.flush()

        def log_message(self, *args):
            pass
    return Sse


@contextmanager
def sse_replica(gap_s: float = 0.05, words: int = 1000):
    """Serve on a free local port; yield its URL."""
    server = ThreadingHTTPServer(('127.0.0.1', 0), _handler(gap_s, words))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f'http://127.0.0.1:{server.server_port}'
    finally:
        server.shutdown()
        server.server_close()
