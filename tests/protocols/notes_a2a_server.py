"""An A2A 1.0 agent built with the official a2a-sdk server (JSON-RPC binding), for a node
to use as its external agent (`[[agent.external]] a2a = "http://127.0.0.1:PORT"`).

It answers from the notes of examples/agents/notes_agent.py. Each task it is given is
logged to LOG as one JSON line (`{"text": ..., "metadata": ...}`); with `--delay S` a task
runs as a long one (submitted, working, then after S seconds an artifact and completed), and
a cancelled task logs `{"canceled": TASK_ID}`. Prints `listening on URL` when ready.

    python notes_a2a_server.py LOG [--delay S]
"""

import argparse
import asyncio
import json
import os
import socket
import sys

import uvicorn
from a2a.helpers.proto_helpers import new_task, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, TaskState
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "agents"))
from notes_agent import answer  # noqa: E402


class NotesExecutor(AgentExecutor):
    def __init__(self, log, delay):
        self.log = log
        self.delay = delay

    def write(self, entry):
        with open(self.log, "a") as f:
            f.write(json.dumps(entry) + "\n")

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        metadata = MessageToDict(context.message.metadata) if context.message.HasField("metadata") else {}
        self.write({"text": text, "metadata": metadata})
        reply = answer({"description": text})
        if self.delay <= 0:
            body = reply["result"] if reply["ok"] else f"no answer: {reply['error']}"
            await event_queue.enqueue_event(new_text_message(body, context_id=context.context_id))
            return
        await event_queue.enqueue_event(new_task(context.task_id, context.context_id,
                                                 TaskState.TASK_STATE_SUBMITTED,
                                                 history=[context.message]))
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        await asyncio.sleep(self.delay)
        if reply["ok"]:
            await updater.add_artifact([new_text_part(reply["result"])], name="answer")
            await updater.complete()
        else:
            await updater.failed(new_text_message(reply["error"], context_id=context.context_id,
                                                  task_id=context.task_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.write({"canceled": context.task_id})
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("--delay", type=float, default=0.0)
    args = p.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    card = AgentCard(
        name="Station notes",
        description="Knows the station's maintenance notes: filters, pumps, inspections.",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=f"{url}/rpc", protocol_binding="JSONRPC",
                                              protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="notes", name="Maintenance notes",
                           description="Answers from the station's maintenance notes.",
                           tags=["maintenance"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=NotesExecutor(args.log, args.delay),
        task_store=InMemoryTaskStore(),
        agent_card=card,
    )
    app = Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/rpc"))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))

    async def serve():
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.05)
        print(f"listening on {url}", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
