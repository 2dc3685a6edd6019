"""A tiny MCP server (stdio) for tests/protocols: the spare-parts register of a station.

`part_status` takes a part number. Its input schema requires the form `P-` and four digits,
but the function does not enforce it: every call's raw arguments are appended, as one JSON
line, to the file named by the first argument, so the test can check each call a node made
against the schema the node was given.
"""

import json
import sys
from typing import Annotated

from mcp.server.mcpserver import MCPServer
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
) -> str:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({"part_id": part_id}) + "\n")
    return f"Part {part_id}: {PARTS.get(part_id, 'not in the register')}."


if __name__ == "__main__":
    server.run("stdio")
