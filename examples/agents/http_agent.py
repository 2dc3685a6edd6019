#!/usr/bin/env python3
"""An external agent for a Starling node, reached over HTTP (docs/agents.md).

A small HTTP service: each POST carries one task as JSON and is answered with
`{"result": ..., "ok": true}` from the same notes as notes_agent.py. It listens on
loopback only and prints `listening on http://127.0.0.1:PORT` once ready (`--port 0`
picks a free port). Standard library only. Configure it on a node:

    [[agent.external]]
    name = "station_notes"
    description = "Knows the station's maintenance notes: filters, pumps, inspections."
    url = "http://127.0.0.1:8765/"
"""

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from notes_agent import answer  # noqa: E402

MAX_BODY = 64 * 1024


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        if length <= 0 or length > MAX_BODY:
            return self.reply(400, {"ok": False, "error": "a task of 1 to 65536 bytes is expected"})
        try:
            task = json.loads(self.rfile.read(length))
        except json.JSONDecodeError as e:
            return self.reply(400, {"ok": False, "error": f"the task is not JSON: {e}"})
        if not isinstance(task, dict):
            return self.reply(400, {"ok": False, "error": "the task is a JSON object"})
        self.reply(200, answer(task))

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8765)
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
