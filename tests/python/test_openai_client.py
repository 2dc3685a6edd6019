"""The official OpenAI Python client against a running `starling serve`.

Run through tests/python/run.sh, which starts the server and sets STARLING_API_BASE.
"""

import json
import math
import os

import openai
import pytest
from openai import OpenAI

BASE = os.environ.get("STARLING_API_BASE")

pytestmark = pytest.mark.skipif(BASE is None, reason="run through tests/python/run.sh")

CAPITAL = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def client():
    return OpenAI(base_url=BASE, api_key="unused-on-localhost", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def served(client):
    by_kind = {}
    for m in client.models.list().data:
        by_kind[m.to_dict()["kind"]] = m.id
    return by_kind


def test_models_are_listed_and_retrievable(client, served):
    assert set(served) == {"chat", "embedding"}
    chat = client.models.retrieve(served["chat"])
    assert chat.id == served["chat"]
    assert chat.object == "model"
    assert chat.owned_by == "starling"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_completion_answers_and_counts_tokens(client, served):
    r = client.chat.completions.create(model=served["chat"], messages=CAPITAL, temperature=0, max_tokens=24)
    choice = r.choices[0]
    assert r.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10
    assert 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_matches_the_whole_answer(client, served):
    whole = client.chat.completions.create(model=served["chat"], messages=CAPITAL, temperature=0, max_tokens=24)
    stream = client.chat.completions.create(
        model=served["chat"],
        messages=CAPITAL,
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_sequence_ends_the_answer(client, served):
    r = client.chat.completions.create(
        model=served["chat"],
        messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
        temperature=0,
        max_tokens=64,
        stop=["5"],
    )
    content = r.choices[0].message.content
    assert "4" in content, content
    assert "5" not in content, content
    assert r.choices[0].finish_reason == "stop"


def test_json_schema_response_format_is_obeyed(client, served):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}, "country": {"type": "string", "maxLength": 40}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=served["chat"],
        messages=[{"role": "user", "content": "Name the capital of France and its country as JSON."}],
        temperature=0,
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema, "strict": True}},
    )
    data = json.loads(r.choices[0].message.content)
    assert set(data) == {"city", "country"}
    assert all(isinstance(v, str) for v in data.values())
    assert r.choices[0].finish_reason == "stop"


def test_invalid_requests_raise_bad_request(client, served):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=served["chat"], messages=CAPITAL, n=9)
    assert e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=served["chat"], messages=CAPITAL, temperature=3)
    assert e.value.param == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=CAPITAL)


def _cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_base64_and_float_agree(client, served):
    texts = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Quarterly revenue grew by 4%."]
    # The client asks for base64 by default and decodes it itself.
    r = client.embeddings.create(model=served["embedding"], input=texts)
    assert [d.index for d in r.data] == [0, 1, 2]
    vectors = [d.embedding for d in r.data]
    assert all(len(v) == 384 for v in vectors)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-3 for v in vectors)
    assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[0], vectors[2]) + 0.2
    floats = client.embeddings.create(model=served["embedding"], input=texts, encoding_format="float")
    for a, b in zip(vectors, (d.embedding for d in floats.data)):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-6
    single = client.embeddings.create(model=served["embedding"], input=texts[0], encoding_format="float")
    assert len(single.data) == 1
    assert max(abs(x - y) for x, y in zip(single.data[0].embedding, vectors[0])) < 1e-4


# "hello world, Starling" as OpenAI's cl100k_base token ids (tiktoken's encoding; what
# LangChain's OpenAIEmbeddings sends by default). tiktoken itself fetches its vocabulary
# from the internet, which CI cannot reach, so the ids are written out here.
HELLO_IDS = [15339, 1917, 11, 7834, 2785]


def test_embeddings_of_token_ids_equal_those_of_their_text(client, served):
    text = client.embeddings.create(model=served["embedding"], input="hello world, Starling", encoding_format="float")
    for ids in (HELLO_IDS, [HELLO_IDS, HELLO_IDS]):
        r = client.embeddings.create(model=served["embedding"], input=ids, encoding_format="float")
        for d in r.data:
            assert max(abs(x - y) for x, y in zip(d.embedding, text.data[0].embedding)) < 1e-5
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=served["embedding"], input=[100_256])


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def get_weather(city):
    """The tool the model calls: a real Python function."""
    get_weather.calls.append(city)
    return f"17 degrees and sunny in {city}"


get_weather.calls = []


def test_required_tool_call_runs_the_function_and_the_conversation_continues(client, served):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model=served["chat"],
        messages=messages,
        temperature=0,
        max_tokens=120,
        tools=[WEATHER_TOOL],
        tool_choice="required",
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls and all(c.type == "function" and c.function.name == "get_weather" for c in calls)
    messages.append(choice.message.model_dump(exclude_none=True))
    for call in calls:
        args = json.loads(call.function.arguments)  # every call parses ...
        assert set(args) == {"city"} and isinstance(args["city"], str)  # ... and fits the schema
        messages.append({"role": "tool", "tool_call_id": call.id, "content": get_weather(**args)})
    assert get_weather.calls, "the function ran"
    final = client.chat.completions.create(
        model=served["chat"], messages=messages, temperature=0, max_tokens=60, tools=[WEATHER_TOOL]
    )
    # The model answers in text (the call and its result were accepted as history); with
    # the 135M model its wording, and whether it repeats "17", depends on the CPU's kernels.
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content.strip()


def test_tools_without_tool_choice_call_the_function_and_its_result_goes_back(client, served):
    # OpenAI's default is `auto`: the server's tool router (on by default, an embedding model
    # is served) finds get_weather closest to the question, and the model writes its
    # arguments under the schema.
    tools = [WEATHER_TOOL, {"type": "function", "function": {
        "name": "send_email", "description": "Send an email to a colleague.",
        "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                       "required": ["to", "body"]}}}]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model=served["chat"], messages=messages, temperature=0, max_tokens=120, tools=tools
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather", calls
    args = json.loads(calls[0].function.arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)
    before = len(get_weather.calls)
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": get_weather(**args)})
    assert len(get_weather.calls) == before + 1, "the function ran"
    # After a `tool` result the model decides alone between an answer and another call.
    final = client.chat.completions.create(
        model=served["chat"], messages=messages, temperature=0, max_tokens=60, tools=tools
    )
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_parse_with_a_pydantic_tool_returns_its_arguments_parsed(client, served):
    from pydantic import BaseModel, Field

    class GetWeather(BaseModel):
        """Current weather in a city."""

        city: str = Field(max_length=40)

    # `pydantic_function_tool` writes a strict schema; the router (on by default) picks the
    # tool for the question, and `parse` turns the arguments into the model.
    r = client.chat.completions.parse(
        model=served["chat"],
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        temperature=0,
        max_tokens=120,
        tools=[openai.pydantic_function_tool(GetWeather)],
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1, r
    assert isinstance(calls[0].function.parsed_arguments, GetWeather)


def test_streamed_tool_calls_assemble_as_openai_clients_expect(client, served):
    stream = client.chat.completions.create(
        model=served["chat"],
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        temperature=0,
        max_tokens=120,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        stream=True,
    )
    calls, finish = {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            slot["name"] += tc.function.name or ""
            slot["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert len(calls) == 1
    call = calls[0]
    assert call["id"].startswith("call_") and call["name"] == "get_weather"
    assert set(json.loads(call["arguments"])) == {"city"}


def test_tool_mistakes_raise_bad_request(client, served):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=served["chat"],
            messages=CAPITAL,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "not_a_tool"}},
        )
    assert e.value.param == "tool_choice.function.name"


def test_text_completion_continues_the_prompt_whole_streamed_and_echoed(client, served):
    prompt = "The capital of France is"
    whole = client.completions.create(model=served["chat"], prompt=prompt, max_tokens=12, temperature=0)
    assert whole.object == "text_completion"
    choice = whole.choices[0]
    assert choice.text.strip() and choice.finish_reason in ("stop", "length")
    # Raw text: far fewer prompt tokens than the same words inside the chat template.
    assert 0 < whole.usage.prompt_tokens < 10
    assert 0 < whole.usage.completion_tokens <= 12
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=served["chat"], prompt=prompt, max_tokens=12, temperature=0, stream=True)
        if c.choices
    )
    assert streamed == choice.text
    echoed = client.completions.create(model=served["chat"], prompt=prompt, max_tokens=12, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + choice.text
    default = client.completions.create(model=served["chat"], prompt="Once upon a time", temperature=0)
    assert default.usage.completion_tokens <= 16  # OpenAI's default max_tokens
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=served["chat"], prompt=[])


def test_logprobs_score_each_token_whole_and_streamed(client, served):
    r = client.chat.completions.create(
        model=served["chat"], messages=CAPITAL, temperature=0, max_tokens=16, logprobs=True, top_logprobs=3
    )
    choice = r.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == r.usage.completion_tokens
    assert "".join(e.token for e in entries) == choice.message.content
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
        # Greedy picks the most likely token.
        assert e.top_logprobs[0].token == e.token
    stream = client.chat.completions.create(
        model=served["chat"], messages=CAPITAL, temperature=0, max_tokens=16, logprobs=True, top_logprobs=3, stream=True
    )
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in entries]
    legacy = client.completions.create(
        model=served["chat"], prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=2
    )
    lp = legacy.choices[0].logprobs
    assert "".join(lp.tokens) == legacy.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=served["chat"], messages=CAPITAL, top_logprobs=3)


def test_echo_with_logprobs_scores_the_prompt_as_evaluation_harnesses_ask(client, served):
    # How lm-evaluation-harness scores a continuation: echo the context and the continuation
    # with logprobs, then sum the continuation's token log-probabilities.
    def scored(text):
        r = client.completions.create(model=served["chat"], prompt=text, max_tokens=1, temperature=0, echo=True, logprobs=2)
        lp = r.choices[0].logprobs
        assert r.choices[0].text.startswith(text)
        assert "".join(lp.tokens) == r.choices[0].text
        assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
        # The prompt's tokens come first; the last entry is the generated token.
        assert all(v is None or v <= 0 for v in lp.token_logprobs)
        assert all(len(t) == 2 for t in lp.top_logprobs[1:])
        return lp

    context = "The capital of France is"
    right, wrong = scored(context + " Paris"), scored(context + " banana")
    n = len(scored(context).tokens) - 1  # the context's tokens, without the generated one
    assert right.tokens[:n] == wrong.tokens[:n]
    # The shared context scores the same both times; the continuations differ.
    assert right.token_logprobs[:n] == wrong.token_logprobs[:n]
    assert sum(right.token_logprobs[n:-1]) > sum(wrong.token_logprobs[n:-1])
    # Streamed: the first event carries the prompt and its scores.
    first = next(
        iter(client.completions.create(
            model=served["chat"], prompt=context, max_tokens=2, temperature=0, echo=True, logprobs=1, stream=True
        ))
    )
    assert first.choices[0].text == context
    assert "".join(first.choices[0].logprobs.tokens) == context


def test_token_id_prompts_in_a_batch_are_scored_as_lm_eval_asks(client, served):
    # lm-evaluation-harness sends a batch of token-id prompts with echo, logprobs and
    # max_tokens 0 or 1, and reads each choice by its index.
    ids = [[504, 3575, 282, 4649, 314, 7042], [504, 3575, 282]]
    r = client.completions.create(model=served["chat"], prompt=ids, max_tokens=0, echo=True, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == 9 and r.usage.completion_tokens == 0
    for choice, prompt in zip(r.choices, ids):
        lp = choice.logprobs
        assert choice.finish_reason == "length"
        assert len(lp.tokens) == len(prompt)  # every id, none added or merged
        assert "".join(lp.tokens) == choice.text
        assert lp.token_logprobs[0] is None  # nothing before the first id
        assert all(v <= 0 for v in lp.token_logprobs[1:])
    # The prefix scores as it does inside the longer prompt.
    assert r.choices[1].logprobs.token_logprobs == r.choices[0].logprobs.token_logprobs[:3]
    one = client.completions.create(model=served["chat"], prompt=ids[0], max_tokens=1, echo=True, logprobs=1)
    assert one.choices[0].logprobs.token_logprobs[:6] == r.choices[0].logprobs.token_logprobs
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=served["chat"], prompt=[[1, 10**9]], max_tokens=0, echo=True, logprobs=1)


RESPONSE_WEATHER_TOOL = {"type": "function", "strict": True, **WEATHER_TOOL["function"]}


def test_responses_api_answers_whole_and_streamed_as_chat_does(client, served):
    ask = dict(
        model=served["chat"],
        instructions=CAPITAL[0]["content"],
        input=CAPITAL[1]["content"],
        temperature=0,
        max_output_tokens=24,
    )
    r = client.responses.create(**ask)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert "Paris" in r.output_text
    assert r.usage.input_tokens > 10 and 0 < r.usage.output_tokens <= 24
    chat = client.chat.completions.create(model=served["chat"], messages=CAPITAL, temperature=0, max_tokens=24)
    assert r.output_text == chat.choices[0].message.content
    with client.responses.stream(**ask) as stream:
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    # `response.incomplete` when max_output_tokens cut it, as OpenAI sends it.
    assert events[-1].type == ("response.incomplete" if r.status == "incomplete" else "response.completed")
    assert "".join(deltas) == events[-1].response.output[0].content[0].text == r.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**ask, previous_response_id=r.id)
    assert e.value.param == "previous_response_id"
    assert "stores no responses" in e.value.message


def test_responses_parse_fills_a_pydantic_model(client, served):
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=24)
        country: str = Field(max_length=24)

    r = client.responses.parse(
        model=served["chat"],
        input="Name a city in Italy.",
        text_format=City,
        temperature=0,
        max_output_tokens=80,
    )
    assert isinstance(r.output_parsed, City)  # the schema is enforced token by token


def test_responses_function_call_runs_and_its_output_reaches_the_answer(client, served):
    inputs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(
        model=served["chat"],
        input=inputs,
        tools=[RESPONSE_WEATHER_TOOL],
        tool_choice="required",
        temperature=0,
        max_output_tokens=120,
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    before = len(get_weather.calls)
    inputs += [c.model_dump(exclude_none=True) for c in calls]
    for c in calls:
        args = json.loads(c.arguments)  # every call parses ...
        assert set(args) == {"city"} and isinstance(args["city"], str)  # ... and fits the schema
        inputs.append({"type": "function_call_output", "call_id": c.call_id, "output": get_weather(**args)})
    assert len(get_weather.calls) > before, "the function ran"
    final = client.responses.create(
        model=served["chat"], input=inputs, tools=[RESPONSE_WEATHER_TOOL], temperature=0, max_output_tokens=60
    )
    assert final.output[0].type in ("message", "function_call")
    assert final.status in ("completed", "incomplete")


def test_n_answers_are_separate_generations(client, served):
    r = client.chat.completions.create(
        model=served["chat"], messages=CAPITAL, temperature=1.0, seed=7, max_tokens=12, n=3
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert all(texts) and len(set(texts)) > 1, texts  # sampled with seeds 7, 8, 9
    again = client.chat.completions.create(
        model=served["chat"], messages=CAPITAL, temperature=1.0, seed=7, max_tokens=12, n=3
    )
    assert [c.message.content for c in again.choices] == texts  # seeded: the same answers
    one = client.chat.completions.create(model=served["chat"], messages=CAPITAL, temperature=1.0, seed=7, max_tokens=12)
    assert one.choices[0].message.content == texts[0]
    singles = [one] + [
        client.chat.completions.create(model=served["chat"], messages=CAPITAL, temperature=1.0, seed=s, max_tokens=12)
        for s in (8, 9)
    ]
    assert [s.choices[0].message.content for s in singles] == texts
    assert r.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    legacy = client.completions.create(model=served["chat"], prompt="Once upon a time", n=2, temperature=1.0, seed=3)
    assert [c.index for c in legacy.choices] == [0, 1]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=served["chat"], messages=CAPITAL, n=2, stream=True)


def test_metrics_count_what_was_served(client, served):
    import urllib.request

    def counters():
        with urllib.request.urlopen(BASE.removesuffix("/v1") + "/metrics", timeout=10) as r:
            assert r.headers["content-type"].startswith("text/plain")
            lines = r.read().decode().splitlines()
        return {l.split()[0]: float(l.split()[1]) for l in lines if l and not l.startswith("#")}

    before = counters()
    r = client.chat.completions.create(model=served["chat"], messages=CAPITAL, temperature=0, max_tokens=5)
    client.embeddings.create(model=served["embedding"], input=["a", "b"])
    after = counters()
    assert after["starling_chat_completions_total"] == before["starling_chat_completions_total"] + 1
    assert after["starling_tokens_generated_total"] - before["starling_tokens_generated_total"] == r.usage.completion_tokens
    assert after["starling_embedded_texts_total"] == before["starling_embedded_texts_total"] + 2
    assert after["starling_http_server_errors_total"] == 0
