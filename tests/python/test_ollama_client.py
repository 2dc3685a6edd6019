"""The `ollama` Python package against a running `starling serve` (Ollama's API on the same port).

Run through tests/python/run.sh, which starts the server and sets STARLING_API_BASE.
"""

import json
import math
import os

import jsonschema
import ollama
import pytest

BASE = os.environ.get("STARLING_API_BASE")

pytestmark = pytest.mark.skipif(BASE is None, reason="run through tests/python/run.sh")

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module")
def client():
    return ollama.Client(host=BASE.removesuffix("/v1"), timeout=180)


@pytest.fixture(scope="module")
def names(client):
    by_family = {}
    for m in client.list().models:
        kind = "embedding" if "embedding" in client.show(m.model).capabilities else "chat"
        by_family[kind] = m.model
    return by_family


def test_models_are_listed_shown_and_running(client, names):
    assert set(names) == {"chat", "embedding"}
    assert all(n.endswith(":latest") for n in names.values())
    shown = client.show(names["chat"])
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert shown.details.format == "gguf"
    running = {m.model for m in client.ps().models}
    assert running == set(names.values())
    with pytest.raises(ollama.ResponseError) as e:
        client.show("no-such-model")
    assert e.value.status_code == 404


def test_chat_answers_and_streaming_matches(client, names):
    whole = client.chat(model=names["chat"], messages=CAPITAL, options=GREEDY)
    assert "Paris" in whole.message.content
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.prompt_eval_count > 10 and 0 < whole.eval_count <= 24
    assert whole.total_duration > 0
    parts = list(client.chat(model=names["chat"], messages=CAPITAL, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count


def test_generate_with_the_template_and_raw(client, names):
    r = client.generate(model=names["chat"], prompt="What is the capital of France?", options=GREEDY)
    assert "Paris" in r.response and r.done
    # Raw: the prompt is continued as it is, without the chat template (far fewer prompt
    # tokens than the templated prompt with its default system message).
    raw = client.generate(model=names["chat"], prompt="The capital of France is", raw=True, options=GREEDY)
    assert raw.response.strip() and raw.prompt_eval_count < r.prompt_eval_count
    loaded = client.generate(model=names["chat"], prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


def test_format_schema_is_obeyed(client, names):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    r = client.chat(
        model=names["chat"],
        messages=[{"role": "user", "content": "Name a city and its country as JSON."}],
        format=schema,
        options={"temperature": 0, "num_predict": 80},
    )
    jsonschema.validate(json.loads(r.message.content), schema)
    r = client.generate(model=names["chat"], prompt="Describe Paris as JSON.", format="json",
                        options={"temperature": 0, "num_predict": 80})
    assert isinstance(json.loads(r.response), dict)


def test_embed_and_the_older_embeddings_call_agree(client, names):
    texts = ["The cat sat on the mat.", "A kitten rested on the rug.", "Quarterly tax filing deadlines."]
    r = client.embed(model=names["embedding"], input=texts)
    vecs = r.embeddings
    assert len(vecs) == 3 and all(len(v) == 384 for v in vecs)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-3 for v in vecs)
    cos = lambda a, b: sum(x * y for x, y in zip(a, b))
    assert cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2]) + 0.2
    old = client.embeddings(model=names["embedding"], prompt=texts[0]).embedding
    assert max(abs(a - b) for a, b in zip(old, vecs[0])) < 1e-5
    short = client.embed(model=names["embedding"], input=texts[0], dimensions=64).embeddings[0]
    assert len(short) == 64 and abs(math.sqrt(sum(x * x for x in short)) - 1) < 1e-3


def test_tool_history_in_ollamas_shape_is_accepted(client, names):
    # Ollama's tool calls carry their arguments as objects and no ids; the result names
    # its tool. The model then answers in text.
    r = client.chat(
        model=names["chat"],
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "17 degrees and sunny", "tool_name": "get_weather"},
        ],
        tools=[{"type": "function", "function": {
            "name": "get_weather", "description": "The current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        options={"temperature": 0, "num_predict": 40},
    )
    assert r.done and (r.message.content.strip() or r.message.tool_calls)


def test_tools_are_called_and_the_result_goes_back(client, names):
    # Ollama has no tool_choice (it is `auto`): the server's tool router picks get_weather
    # for the question and the model writes its arguments; the function runs, and its
    # result goes back in Ollama's shape.
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ran = []

    def get_weather(city):
        ran.append(city)
        return f"17 degrees and sunny in {city}"

    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat(model=names["chat"], messages=messages, tools=tools, options={"temperature": 0, "num_predict": 120})
    calls = r.message.tool_calls
    assert calls and len(calls) == 1 and calls[0].function.name == "get_weather", r.message
    args = dict(calls[0].function.arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)
    messages.append(r.message)
    messages.append({"role": "tool", "content": get_weather(**args), "tool_name": "get_weather"})
    assert ran
    final = client.chat(model=names["chat"], messages=messages, tools=tools, options={"temperature": 0, "num_predict": 40})
    assert final.done and (final.message.content.strip() or final.message.tool_calls)


def test_what_cannot_be_honoured_is_refused(client, names):
    for kwargs in (
        {"messages": [{"role": "user", "content": "hi", "images": ["aGVsbG8="]}]},
        {"messages": CAPITAL, "options": {"mirostat": 2}},
        {"messages": CAPITAL, "options": {"no_such_option": 1}},
        {"messages": CAPITAL, "think": True},
    ):
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model=names["chat"], **kwargs)
        assert e.value.status_code == 400 and e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="no-such-model", messages=CAPITAL)
    assert e.value.status_code == 404 and "no-such-model" in e.value.error


def test_logprobs_come_with_the_text_they_score(client, names):
    r = client.chat(model=names["chat"], messages=CAPITAL, options=GREEDY, logprobs=True, top_logprobs=2)
    assert len(r.logprobs) == r.eval_count
    assert "".join(l.token for l in r.logprobs) == r.message.content
    assert all(l.logprob <= 0 and len(l.top_logprobs) == 2 for l in r.logprobs)
    parts = list(client.generate(model=names["chat"], prompt="What is the capital of France?", options=GREEDY,
                                 logprobs=True, stream=True))
    tokens = [l.token for p in parts for l in (p.logprobs or [])]
    assert "".join(tokens) == "".join(p.response for p in parts)


def test_pull_takes_registry_models_and_refuses_anything_else(client, names):
    # The default chat model is in the cache already: the pull checks it and succeeds.
    statuses = [p.status for p in client.pull("smollm2-135m-instruct", stream=True)]
    assert statuses == ["success"]
    assert client.pull("smollm2-135m-instruct:latest").status == "success"
    # Only registry names: a path or a source string could probe files or run pip.
    for bad in ("no-such-model", "/etc/passwd", "pip:six==1.16.0"):
        with pytest.raises(ollama.ResponseError) as e:
            client.pull(bad)
        assert e.value.status_code == 404
        assert "registry" in str(e.value)
