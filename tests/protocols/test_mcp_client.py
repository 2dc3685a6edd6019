"""The official MCP Python SDK against `starling mcp` (run by tests/protocols/run.sh).

The client launches `starling mcp --api ADDR` over stdio, as a desktop assistant would,
and the tools forward to a coordinator node (ada) that holds no documents. Its one peer,
basil, holds documents saying that moonflower seeds germinate best at 24 degrees Celsius,
so an answer with that fact had to cross the swarm.
"""

import asyncio
import json
import os
import urllib.request

import jsonschema
from mcp import Client, StdioServerParameters

BIN = os.environ["STARLING_BIN"]
API = os.environ["STARLING_API"]


def server(*extra):
    return StdioServerParameters(command=BIN, args=["mcp", "--api", API, *extra])


def run(coro):
    return asyncio.run(coro)


def text_of(result):
    return "\n".join(c.text for c in result.content if c.type == "text")


def test_lists_the_three_tools_with_their_argument_schemas():
    async def go():
        async with Client(server()) as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in run(go())}
    assert set(tools) == {"ask_swarm", "search_agents", "search_memories"}
    ask = tools["ask_swarm"].input_schema
    assert ask["type"] == "object"
    assert ask["required"] == ["question"]
    assert ask["properties"]["question"]["type"] == "string"
    assert tools["search_agents"].input_schema["required"] == ["query"]
    for t in tools.values():
        assert t.description and len(t.description) > 40
        assert t.annotations.read_only_hint is True


def test_ask_swarm_answers_from_the_nodes_documents_with_the_source():
    async def go():
        async with Client(server()) as client:
            return await client.call_tool(
                "ask_swarm",
                {
                    "question": "At what temperature do moonflower seeds germinate best, "
                    "and how long should they soak?"
                },
            )

    r = run(go())
    assert not r.is_error, text_of(r)
    s = r.structured_content
    assert s["status"] == "answered", s
    assert "24" in s["answer"] and "8 hours" in s["answer"], s["answer"]
    assert "basil" in s["members"], s
    docs = {(c["node"], c["document"]) for c in s["citations"]}
    assert ("basil", "moonflower.md") in docs, s["citations"]
    quotes = " ".join(c["quote"] for c in s["citations"])
    assert "24 degrees" in quotes and "8 hours" in quotes, s["citations"]
    text = text_of(r)
    assert text.startswith(s["answer"])
    assert "Sources:" in text and "moonflower.md" in text


def test_search_agents_finds_the_botanist_by_meaning():
    async def go():
        async with Client(server()) as client:
            return await client.call_tool(
                "search_agents", {"query": "who knows how to grow plants", "k": 3}
            )

    r = run(go())
    assert not r.is_error, text_of(r)
    agents = r.structured_content["agents"]
    assert agents[0]["card"]["card"]["name"] == "basil"
    assert "basil" in text_of(r)


def test_search_memories_returns_a_shared_memory():
    body = json.dumps(
        {
            "domain": "botany",
            "prompt": "How long should moonflower seeds soak before planting?",
            "answer": "8 hours, then plant them 1 cm deep.",
            "score": 0.9,
        }
    ).encode()
    req = urllib.request.Request(
        f"http://{API}/api/memories",
        data=body,
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status in (200, 201)

    async def go():
        async with Client(server()) as client:
            hit = await client.call_tool(
                "search_memories",
                {"query": "soaking moonflower seeds", "domain": "botany", "k": 1},
            )
            miss = await client.call_tool(
                "search_memories", {"query": "soaking moonflower seeds", "domain": "law"}
            )
            return hit, miss

    hit, miss = run(go())
    assert not hit.is_error, text_of(hit)
    memories = hit.structured_content["memories"]
    assert len(memories) == 1
    assert memories[0]["answer"].startswith("8 hours")
    assert "8 hours" in text_of(hit)
    assert miss.structured_content["memories"] == []
    assert "No shared memory matches" in text_of(miss)


def test_bad_arguments_are_errors_the_client_can_show():
    async def go():
        async with Client(server()) as client:
            empty = await client.call_tool("ask_swarm", {"question": "   "})
            big_k = await client.call_tool("search_agents", {"query": "plants", "k": 1000})
            return empty, big_k

    empty, big_k = run(go())
    assert empty.is_error and "empty" in text_of(empty)
    assert big_k.is_error and "between 1 and 100" in text_of(big_k)


def test_a_node_that_is_not_running_is_named_in_the_error():
    async def go():
        params = StdioServerParameters(command=BIN, args=["mcp", "--api", "127.0.0.1:9"])
        async with Client(params) as client:
            return await client.call_tool("search_agents", {"query": "plants"})

    r = run(go())
    assert r.is_error
    assert "no Starling node answers at http://127.0.0.1:9" in text_of(r)


def test_structured_results_validate_against_json():
    # The structured content of every tool is a JSON object (what clients of the
    # 2025-06-18 and 2025-11-25 protocol versions require).
    async def go():
        async with Client(server()) as client:
            return [
                await client.call_tool("search_agents", {"query": "seeds"}),
                await client.call_tool("search_memories", {"query": "seeds"}),
            ]

    for r in run(go()):
        jsonschema.validate(r.structured_content, {"type": "object"})


def test_the_same_server_over_streamable_http():
    """`starling mcp --http` (started by run.sh): the same tools at a URL, as an IDE that
    connects to a running MCP server uses them; the answer again crosses the swarm."""

    async def go():
        async with Client(os.environ["STARLING_MCP_URL"]) as client:
            tools = (await client.list_tools()).tools
            answer = await client.call_tool(
                "ask_swarm",
                {"question": "At what temperature do moonflower seeds germinate best?"},
            )
            return tools, answer

    tools, r = run(go())
    assert {t.name for t in tools} == {"ask_swarm", "search_agents", "search_memories"}
    assert not r.is_error, text_of(r)
    assert "24" in r.structured_content["answer"], r.structured_content
    assert "basil" in r.structured_content["members"]


def test_http_mode_refuses_an_address_off_loopback():
    import subprocess

    out = subprocess.run(
        [BIN, "mcp", "--api", API, "--http", "0.0.0.0:0"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert "loopback" in out.stderr, out.stderr
