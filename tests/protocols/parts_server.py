"""A tiny MCP server for tests/protocols: the spare-parts register of a station.

`part_status` takes a part number. Its input schema requires the form `P-` and four digits,
but the function does not enforce it: every call's raw arguments are appended, as one JSON
line, to the file named by the first argument, so the test can check each call a node made
against the schema the node was given.

    parts_server.py LOG               serves over stdio
    parts_server.py LOG --http PORT   serves over streamable HTTP at http://127.0.0.1:PORT/mcp;
                                      each logged call also records the request's
                                      `X-Desk` header
"""

import json
import sys
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

LOG = sys.argv[1]
PARTS = {
    "P-1042": "shipped on 3 March from the Lumen depot",
    "P-2210": "back-ordered until 20 April",
}

server = MCPServer("parts")


@server.tool(description="The status of a spare part, by its part number (P- and four digits).")
def part_status(
    part_id: Annotated[
        str,
        Field(
            description="The part number, such as P-1042.",
            json_schema_extra={"pattern": "^P-[0-9]{4}$"},
        ),
    ],
    ctx: Context,
) -> str:
    entry = {"part_id": part_id}
    request = ctx.request_context.request
    if request is not None:
        entry["x_desk"] = request.headers.get("x-desk")
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
    return f"Part {part_id}: {PARTS.get(part_id, 'not in the register')}."


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
    else:
        server.run("stdio")
