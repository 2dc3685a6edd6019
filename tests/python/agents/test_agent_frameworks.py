"""Agent frameworks on their default tool paths against a running `starling serve`.

Run through tests/python/run.sh, which starts the server, installs the pinned frameworks in
their own virtual environment and sets STARLING_API_BASE. Each test runs a framework as its
documentation shows, with the real default model, and checks that the tool (a real Python
function) was called with arguments that fit its schema and that its result went back into
the conversation the framework sent. Whether the 135M model then repeats the result in its
own words is not asserted: that depends on the CPU's kernels.
"""

import asyncio
import json
import os

import pytest
from pydantic import BaseModel, Field

BASE = os.environ.get("STARLING_API_BASE")
CHAT = os.environ.get("STARLING_TEST_LLM_NAME", "smollm2-135m-instruct")
EMBED = os.environ.get("STARLING_TEST_EMBED_NAME", "all-minilm-l6-v2")
KEY = "unused-on-localhost"

pytestmark = pytest.mark.skipif(BASE is None, reason="run through tests/python/run.sh")


class City(BaseModel):
    """A city and its country."""

    name: str = Field(max_length=24)
    country: str = Field(max_length=24)


CALLS = []


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: The city's name.
    """
    assert isinstance(city, str)
    CALLS.append(city)
    return f"17 degrees and sunny in {city}"


def called():
    """The cities the tool was called with since the last call to this."""
    out = list(CALLS)
    CALLS.clear()
    return out


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

QUESTION = "What is the weather in Paris?"


# --- LangChain -------------------------------------------------------------------------


def test_langchain_with_structured_output_by_function_calling():
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=CHAT, base_url=BASE, api_key=KEY, temperature=0, max_tokens=80)
    city = llm.with_structured_output(City, method="function_calling").invoke("Name a city in Italy.")
    assert isinstance(city, City)


def test_langchain_bind_tools_runs_the_tool_and_sends_its_result_back():
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    weather = tool(get_weather)
    llm = ChatOpenAI(model=CHAT, base_url=BASE, api_key=KEY, temperature=0, max_tokens=120)
    # bind_tools as documented, without a tool_choice (so `auto`): the server's tool router
    # has the model call get_weather for the question.
    bound = llm.bind_tools([weather])
    messages = [HumanMessage(QUESTION)]
    ai = bound.invoke(messages)
    assert ai.tool_calls and all(c["name"] == "get_weather" for c in ai.tool_calls), ai
    messages.append(ai)
    for c in ai.tool_calls:
        messages.append(ToolMessage(weather.invoke(c["args"]), tool_call_id=c["id"]))
    assert called()
    final = llm.bind_tools([weather]).invoke(messages)
    assert final.content or final.tool_calls


def test_langchain_default_embeddings_send_token_ids_and_match_plain_text():
    from langchain_openai import OpenAIEmbeddings
    from openai import OpenAI

    texts = ["The reactor uses liquid argon.", "Bees make honey."]
    # The default sends cl100k_base token ids (tiktoken, whose data file run.sh provides).
    vectors = OpenAIEmbeddings(model=EMBED, base_url=BASE, api_key=KEY).embed_documents(texts)
    plain = OpenAI(base_url=BASE, api_key=KEY).embeddings.create(model=EMBED, input=texts)
    for got, want in zip(vectors, plain.data):
        assert len(got) == len(want.embedding)
        assert sum(a * b for a, b in zip(got, want.embedding)) > 0.999


# --- pydantic-ai ----------------------------------------------------------------------


def _pydantic_ai_model():
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(CHAT, provider=OpenAIProvider(base_url=BASE, api_key=KEY))


def test_pydantic_ai_structured_output_by_its_default_tool():
    from pydantic_ai import Agent

    agent = Agent(_pydantic_ai_model(), output_type=City, model_settings={"temperature": 0, "max_tokens": 80})
    result = agent.run_sync("Name a city in Italy.")
    assert isinstance(result.output, City)


def test_pydantic_ai_agent_with_a_tool_and_structured_output_ends_with_a_valid_output():
    from pydantic_ai import Agent
    from pydantic_ai.messages import ToolReturnPart

    agent = Agent(
        _pydantic_ai_model(),
        output_type=City,
        model_settings={"temperature": 0, "max_tokens": 80},
        instructions="First call get_weather, then name the city.",
    )
    agent.tool_plain(get_weather)
    result = agent.run_sync(QUESTION)
    returns = [
        p
        for m in result.all_messages()
        for p in getattr(m, "parts", [])
        if isinstance(p, ToolReturnPart) and p.tool_name == "get_weather"
    ]
    # Output through a tool is pydantic-ai's default, so it sends tool_choice required with
    # get_weather and its output tool; on that first turn the server's tool router picks
    # get_weather for the question. Its return goes back, and the run ends with the output
    # tool's validated City.
    assert isinstance(result.output, City)
    assert returns, "get_weather was called"
    assert called() and "17 degrees" in str(returns[0].content)


# --- AutoGen --------------------------------------------------------------------------


def test_autogen_assistant_agent_runs_the_tool_and_answers():
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.messages import ToolCallExecutionEvent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    client = OpenAIChatCompletionClient(
        model=CHAT,
        base_url=BASE,
        api_key=KEY,
        temperature=0,
        max_tokens=120,
        model_info={
            "vision": False,
            "function_calling": True,
            "json_output": True,
            "structured_output": True,
            "family": "unknown",
        },
    )

    async def run():
        agent = AssistantAgent("assistant", model_client=client, tools=[get_weather], reflect_on_tool_use=True)
        try:
            return await agent.run(task=QUESTION)
        finally:
            await client.close()

    result = asyncio.run(run())
    executed = [m for m in result.messages if isinstance(m, ToolCallExecutionEvent)]
    answer = result.messages[-1]
    assert answer.source == "assistant"
    # AutoGen sends tool_choice auto: the server's tool router (on by default) finds
    # get_weather closest to the question and has the model call it; the result goes back
    # and, asked again after it (reflect_on_tool_use), the model answers in text.
    assert executed, "the tool router called get_weather under tool_choice auto"
    cities = called()
    assert cities and all(c.strip() for c in cities), cities
    assert "17 degrees" in executed[0].content[0].content
    assert isinstance(answer.content, str) and answer.content.strip()


# --- smolagents -----------------------------------------------------------------------


def test_smolagents_tool_calling_agent_calls_the_tool_and_concludes():
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    model = OpenAIServerModel(model_id=CHAT, api_base=BASE, api_key=KEY, temperature=0, max_tokens=120)
    agent = ToolCallingAgent(tools=[tool(get_weather)], model=model, max_steps=3, verbosity_level=0)
    output = agent.run(QUESTION)
    steps = [s for s in agent.memory.steps if getattr(s, "model_output_message", None)]
    calls = [[c.function.name for c in (s.model_output_message.tool_calls or [])] for s in steps]
    # ToolCallingAgent sends tool_choice required, its calls back as assistant text and the
    # results as user messages. The server's tool router picks get_weather on the first turn
    # and, with it called, final_answer on the next: the run concludes by its final-answer
    # tool, not by running out of steps.
    assert calls[0] == ["get_weather"], calls
    assert called(), "smolagents ran get_weather"
    assert "17 degrees" in str(steps[0].observations), "the result went back to the model"
    assert ["final_answer"] in calls[1:], calls
    assert isinstance(output, str) and output.strip()
    assert not any(getattr(s, "error", None) for s in steps), [s.error for s in steps]


# --- LiteLLM --------------------------------------------------------------------------


def test_litellm_tools_and_text_completion():
    import litellm

    common = dict(api_base=BASE, api_key=KEY, temperature=0)
    r = litellm.completion(
        model=f"openai/{CHAT}",
        messages=[{"role": "user", "content": QUESTION}],
        tools=[WEATHER_TOOL],
        max_tokens=120,
        **common,
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls
    for c in calls:
        get_weather(**json.loads(c.function.arguments))
    assert called()
    t = litellm.text_completion(model=f"text-completion-openai/{CHAT}", prompt="Once upon a time", max_tokens=8, **common)
    assert t.choices[0].text.strip()
