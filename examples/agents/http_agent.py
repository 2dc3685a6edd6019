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

With `--delay SECONDS` it behaves as a long-running agent (IoA's submit / poll / cancel
contract): the POST is answered at once with `{"task_id": ..., "status": "working"}`,
`GET /<task_id>` says `working` until the delay has passed and then gives the answer, and
`DELETE /<task_id>` cancels the task. It prints `submitted ID`, `answered ID` and
`canceled ID` as they happen.

With `--cert FILE --key FILE` (PEM) it serves HTTPS instead and prints `listening on
https://127.0.0.1:PORT`; a node trusts a self-signed certificate through the entry's
`ca_file = "FILE"`.
"""

import argparse
import json
import os
import ssl
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from notes_agent import answer  # noqa: E402

MAX_BODY = 64 * 1024
DELAY = 0.0
TASKS = {}  # task id -> (task, submitted at, canceled)
LOCK = threading.Lock()


def say(line):
    print(line, flush=True)


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
        if DELAY <= 0:
            return self.reply(200, answer(task))
        task_id = uuid.uuid4().hex
        with LOCK:
            TASKS[task_id] = (task, time.monotonic(), False)
        say(f"submitted {task_id}")
        self.reply(202, {"task_id": task_id, "status": "working"})

    def do_GET(self):
        task_id = self.path.strip("/")
        with LOCK:
            entry = TASKS.get(task_id)
        if entry is None:
            return self.reply(404, {"ok": False, "error": f"no task {task_id}"})
        task, since, canceled = entry
        if canceled:
            return self.reply(200, {"task_id": task_id, "status": "canceled", "ok": False,
                                    "error": "the task was canceled"})
        left = DELAY - (time.monotonic() - since)
        if left > 0:
            return self.reply(200, {"task_id": task_id, "status": "working",
                                    "progress": f"about {left:.0f} s left"})
        say(f"answered {task_id}")
        self.reply(200, dict(answer(task), task_id=task_id, status="completed"))

    def do_DELETE(self):
        task_id = self.path.strip("/")
        with LOCK:
            entry = TASKS.get(task_id)
            if entry is not None:
                TASKS[task_id] = (entry[0], entry[1], True)
        if entry is None:
            return self.reply(404, {"ok": False, "error": f"no task {task_id}"})
        say(f"canceled {task_id}")
        self.reply(200, {"task_id": task_id, "status": "canceled"})

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
    global DELAY
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--delay", type=float, default=0.0,
                   help="seconds a task takes; above 0 the submit / poll / cancel contract is used")
    p.add_argument("--cert", help="PEM certificate (chain): serve HTTPS")
    p.add_argument("--key", help="PEM private key of --cert")
    args = p.parse_args()
    if bool(args.cert) != bool(args.key):
        p.error("--cert and --key go together")
    DELAY = args.delay
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    scheme = "http"
    if args.cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.cert, args.key)
        server.socket = tls.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    say(f"listening on {scheme}://127.0.0.1:{server.server_address[1]}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
