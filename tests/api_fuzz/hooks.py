"""Schemathesis hooks for tests/api_fuzz/run.sh, applied to every request of every phase.

- The node runs a real model, so chat completions are kept short: a `max_tokens` /
  `max_completion_tokens` above MAX_TOKENS is lowered to it, and a request naming neither
  gets `max_tokens: MAX_TOKENS`. Values the server must refuse (zero, negative, beyond
  64 bits, not an integer) are left alone, so those cases still test the refusal.
- Schemathesis reuses values it saw in responses (the node's id, memory ids). The run
  checks afterwards that the memories stored before it are all still there, so requests
  that would rightly delete or ignore them (`DELETE /api/memories` naming one of them or
  the node itself, `POST /api/memories/trust` ignoring the node) get another id instead.
  API_FUZZ_PROTECT lists those ids, comma-separated.
"""

import os

import schemathesis

MAX_TOKENS = 8
U64_MAX = 2**64 - 1
LIMITS = ("max_completion_tokens", "max_tokens")
PROTECTED = {p for p in os.environ.get("API_FUZZ_PROTECT", "").split(",") if p}


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _shorten(body):
    if all(body.get(key) is None for key in LIMITS):
        body["max_tokens"] = MAX_TOKENS
    for key in LIMITS:
        if _is_count(body.get(key)) and MAX_TOKENS < body[key] <= U64_MAX:
            body[key] = MAX_TOKENS


def _unprotect(container, keys):
    for key in keys:
        value = container.get(key)
        if isinstance(value, str) and value.strip() in PROTECTED:
            container[key] = value + "-not-a-seeded-id"


@schemathesis.hook
def before_call(context, case, kwargs):
    path, method = case.operation.path, case.method.upper()
    if path == "/v1/chat/completions" and isinstance(case.body, dict):
        _shorten(case.body)
    elif path == "/api/memories" and method == "DELETE" and isinstance(case.query, dict):
        _unprotect(case.query, ("id", "author"))
    elif path == "/api/memories/trust" and method == "POST" and isinstance(case.body, dict):
        _unprotect(case.body, ("author",))
