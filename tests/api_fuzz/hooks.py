"""Schemathesis hooks for tests/api_fuzz/run.sh, applied to every request of every phase.

- The node runs a real model, so chat completions are kept short: a `max_tokens` /
  `max_completion_tokens` (`max_output_tokens` for `/v1/responses`) above MAX_TOKENS is
  lowered to it, and a request naming none gets it set to MAX_TOKENS. Values the server must refuse (zero, negative, beyond
  64 bits, not an integer) are left alone, so those cases still test the refusal. Ollama's
  `/api/chat` and `/api/generate` get the same bound as `options.num_predict` (unless it
  is a value the server must refuse), since Ollama's default is no limit.
- Ollama's routes require a model name, and almost every generated one names no served
  model (404): half of the requests (by a hash of the generated name) name a served
  model instead, so the rest of those bodies is exercised too.
- Schemathesis reuses values it saw in responses (the node's id, memory ids). The run
  checks afterwards that the memories stored before it are all still there, so requests
  that would rightly delete or ignore them (`DELETE /api/memories` naming one of them or
  the node itself, `POST /api/memories/trust` ignoring the node) get another id instead.
  API_FUZZ_PROTECT lists those ids, comma-separated.
"""

import os
import zlib

import schemathesis

MAX_TOKENS = 8
U64_MAX = 2**64 - 1
LIMITS = {
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
}
CHAT_MODEL = os.environ.get("STARLING_TEST_LLM_NAME", "smollm2-135m-instruct")
EMBED_MODEL = os.environ.get("STARLING_TEST_EMBED_NAME", "all-minilm-l6-v2")
OLLAMA_MODELS = {
    "/api/chat": CHAT_MODEL,
    "/api/generate": CHAT_MODEL,
    "/api/show": CHAT_MODEL,
    "/api/embed": EMBED_MODEL,
    "/api/embeddings": EMBED_MODEL,
}
PROTECTED = {p for p in os.environ.get("API_FUZZ_PROTECT", "").split(",") if p}


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _shorten(body, limits):
    if all(body.get(key) is None for key in limits):
        body[limits[0]] = MAX_TOKENS
    for key in limits:
        if _is_count(body.get(key)) and MAX_TOKENS < body[key] <= U64_MAX:
            body[key] = MAX_TOKENS


def _shorten_ollama(body):
    options = body.get("options")
    if options is None:
        options = body["options"] = {}
    if not isinstance(options, dict):
        return
    n = options.get("num_predict")
    if n is None or (_is_count(n) and (n > MAX_TOKENS or n in (-1, -2))):
        options["num_predict"] = MAX_TOKENS


def _unprotect(container, keys):
    for key in keys:
        value = container.get(key)
        if isinstance(value, str) and value.strip() in PROTECTED:
            container[key] = value + "-not-a-seeded-id"


@schemathesis.hook
def before_call(context, case, kwargs):
    path, method = case.operation.path, case.method.upper()
    if path in LIMITS and isinstance(case.body, dict):
        _shorten(case.body, LIMITS[path])
    elif path in OLLAMA_MODELS and isinstance(case.body, dict):
        model = case.body.get("model")
        if isinstance(model, str) and zlib.crc32(model.encode()) % 2 == 0:
            case.body["model"] = OLLAMA_MODELS[path]
        if path in ("/api/chat", "/api/generate"):
            _shorten_ollama(case.body)
    elif path == "/api/memories" and method == "DELETE" and isinstance(case.query, dict):
        _unprotect(case.query, ("id", "author"))
    elif path == "/api/memories/trust" and method == "POST" and isinstance(case.body, dict):
        _unprotect(case.body, ("author",))
