"""A node using an MCP server's tools (run by tests/protocols/run.sh).

dora works alone with no tool but those of parts_server.py, a stdio MCP server it starts
from `[[agent.mcp]]`, and `allow_no_tool = false`: every task goes through that server.
The server logs each call's raw arguments; every one must fit the input schema the server
declares, which the node enforces while its model writes the call.
"""

import asyncio
import json
import os
import urllib.request

import jsonschema
from mcp import Client, StdioServerParameters

DORA = "http://" + os.environ["STARLING_DORA_API"]
LOG = os.environ["STARLING_PARTS_LOG"]


def get(path):
    with urllib.request.urlopen(DORA + path, timeout=60) as r:
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


def test_the_nodes_card_lists_the_mcp_servers_tools():
    me = get("/api/node")["id"]
    [own] = [c for c in get("/api/cards") if c["node_id"] == me]
    assert own["card"]["tools"] == ["parts_part_status"]


def test_a_task_goes_through_the_mcp_tool_with_arguments_that_fit_its_schema():
    before = open(LOG).read().splitlines() if os.path.exists(LOG) else []
    body = json.dumps({"task": "What is the status of spare part P-1042?", "wait": True}).encode()
    req = urllib.request.Request(
        DORA + "/api/tasks", data=body, headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=900) as r:
        result = json.load(r)
    assert result["members"] == ["dora"], result
    calls = open(LOG).read().splitlines()[len(before):]
    assert calls, "the node answered without calling the MCP tool"
    schema = declared_schema()
    assert schema["properties"]["part_id"]["pattern"] == "^P-[0-9]{4}$"
    for line in calls:
        jsonschema.validate(json.loads(line), schema)
