"""A node using an MCP server's tools (run by tests/protocols/run.sh).

dora works alone with no tool but those of parts_server.py, a stdio MCP server it starts
from `[[agent.mcp]]`, and `allow_no_tool = false`: every task goes through that server.
fay is the same with the server already running over streamable HTTP (`url`, and a
header). The server logs each call's raw arguments; every one must fit the input schema
the server declares, which the node enforces while its model writes the call.
"""

import asyncio
import json
import os
import urllib.request

import jsonschema
from mcp import Client, StdioServerParameters

DORA = "http://" + os.environ["STARLING_DORA_API"]
LOG = os.environ["STARLING_PARTS_LOG"]
FAY = "http://" + os.environ["STARLING_FAY_API"]
STOCK_LOG = os.environ["STARLING_STOCK_LOG"]


def get(path, node=DORA):
    with urllib.request.urlopen(node + path, timeout=60) as r:
        return json.load(r)


def lines(path):
    return open(path).read().splitlines() if os.path.exists(path) else []


def ask(node, task):
    body = json.dumps({"task": task, "wait": True}).encode()
    req = urllib.request.Request(
        node + "/api/tasks", data=body, headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.load(r)


def declared_schema():
    """The input schema of `part_status`, as the server itself lists it."""

    async def go():
        params = StdioServerParameters(
            command=os.environ["STARLING_TEST_PYTHON"],
            args=[os.environ["STARLING_PARTS_SERVER"], os.devnull],
        )
        async with Client(params) as c:
            [tool] = (await c.list_tools()).tools
            return tool.input_schema

    return asyncio.run(go())


def own_card(node):
    me = get("/api/node", node)["id"]
    [own] = [c for c in get("/api/cards", node) if c["node_id"] == me]
    return own["card"]


def check_calls(node, log):
    """Asks `node` a part's status; returns the calls its MCP server logged, each checked
    against the tool's declared schema."""
    before = lines(log)
    result = ask(node, "What is the status of spare part P-1042?")
    assert result["members"] == [get("/api/node", node)["name"]], result
    calls = [json.loads(line) for line in lines(log)[len(before):]]
    assert calls, "the node answered without calling the MCP tool"
    schema = declared_schema()
    assert schema["properties"]["part_id"]["pattern"] == "^P-[0-9]{4}$"
    for call in calls:
        jsonschema.validate({"part_id": call["part_id"]}, schema)
    return calls


def test_the_nodes_card_lists_the_mcp_servers_tools():
    assert own_card(DORA)["tools"] == ["parts_part_status"]


def test_a_task_goes_through_the_mcp_tool_with_arguments_that_fit_its_schema():
    check_calls(DORA, LOG)


def test_an_mcp_server_over_streamable_http_is_used_the_same_way_with_its_headers():
    assert own_card(FAY)["tools"] == ["stock_part_status"]
    calls = check_calls(FAY, STOCK_LOG)
    assert all(c["x_desk"] == "fay" for c in calls), calls
