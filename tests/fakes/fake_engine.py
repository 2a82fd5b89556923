"""A stand-in for a vLLM server, for fast launcher tests (the e2e suite uses real vLLM).

Accepts vLLM's command line, serves ``/health`` and ``/v1/models`` on ``--port`` and,
like vLLM, starts a child process (the "engine core") in its own process group. The
environment can make it misbehave: FAKE_ENGINE_EXIT=N exits with N after printing a
line; FAKE_ENGINE_DELAY=S waits S seconds before listening.

When the engine core dies, the server does what vLLM's does: it exits with code 0, or,
with FAKE_ENGINE_KEEP_HTTP=1, keeps HTTP up and answers ``/health`` with 503.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", dest="module")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--served-model-name", default="fake")
    args, _ = ap.parse_known_args()
    print(f"fake engine starting on {args.host}:{args.port}", flush=True)
    if "FAKE_ENGINE_EXIT" in os.environ:
        print("fake engine: simulated start-up failure (CUDA out of memory)", flush=True)
        return int(os.environ["FAKE_ENGINE_EXIT"])
    time.sleep(float(os.environ.get("FAKE_ENGINE_DELAY", "0")))
    # the "engine core": a child that would be orphaned without process-group handling
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    served = args.served_model_name
    engine_dead = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/health" and engine_dead.is_set():
                self.send_response(503)
                self.end_headers()
                return
            if self.path == "/health":
                body = b""
            elif self.path == "/v1/models":
                body = json.dumps({"data": [{"id": served}]}).encode()
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((args.host, args.port), Handler)

    def watch_core() -> None:
        core.wait()
        print("fake engine: engine core died", flush=True)
        engine_dead.set()
        if os.environ.get("FAKE_ENGINE_KEEP_HTTP") != "1":
            server.shutdown()

    threading.Thread(target=watch_core, daemon=True).start()
    print("fake engine ready", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
