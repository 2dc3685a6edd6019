"""The official A2A Python SDK (`a2a-sdk`) against a node's A2A endpoint (run by
tests/protocols/run.sh).

The client resolves the coordinator's agent card from /.well-known/agent-card.json and
speaks JSON-RPC to the interface the card names. The coordinator (ada) holds no documents;
its peer basil does, so the answer has to cross the swarm.
"""

import asyncio
import json
import os
import urllib.error
import urllib.request
import uuid

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from google.protobuf import json_format

API = os.environ["STARLING_API"]
BASE = f"http://{API}"
QUESTION = "At what temperature do moonflower seeds germinate best?"


def run(coro):
    return asyncio.run(coro)


def message(text, **kw):
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)], **kw)


async def client(streaming):
    http = httpx.AsyncClient(timeout=600, trust_env=False)
    return await create_client(BASE, ClientConfig(streaming=streaming, httpx_client=http))


def answer_of(task):
    """The artifact's data part, as JSON."""
    [artifact] = task.artifacts
    text, data = artifact.parts
    return text.text, json_format.MessageToDict(data.data)


def test_the_agent_card_names_the_json_rpc_interface_and_the_nodes_skills():
    with urllib.request.urlopen(f"{BASE}/.well-known/agent-card.json", timeout=30) as r:
        card = json.load(r)
    assert card["name"] == "ada"
    [iface] = card["supportedInterfaces"]
    assert iface == {"url": f"{BASE}/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    assert card["capabilities"]["streaming"] is True
    assert "planning" in card["skills"][0]["tags"]


def test_send_message_returns_the_completed_task_with_the_cited_answer():
    async def go():
        c = await client(streaming=False)
        events = [e async for e in c.send_message(SendMessageRequest(message=message(QUESTION)))]
        task_id = events[0].task.id
        again = await c.get_task(GetTaskRequest(id=task_id))
        await c.close()
        return events, again

    events, again = run(go())
    [event] = events
    task = event.task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    text, data = answer_of(task)
    assert "24" in data["answer"]
    assert data["status"] == "answered"
    assert {"node": "basil", "document": "moonflower.md"}.items() <= data["citations"][0].items()
    assert text.startswith(data["answer"]) and "moonflower.md" in text
    assert task.status.message.role == Role.ROLE_AGENT
    assert [m.role for m in task.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
    # GetTask finds the same task, and the node's own API knows it by the same id.
    assert again.status.state == TaskState.TASK_STATE_COMPLETED
    assert answer_of(again)[1]["answer"] == data["answer"]
    with urllib.request.urlopen(f"{BASE}/api/tasks/{task.id}", timeout=30) as r:
        assert json.load(r)["answer"] == data["answer"]


def test_streaming_sends_the_task_then_its_artifact_and_final_status():
    async def go():
        c = await client(streaming=True)
        events = [e async for e in c.send_message(SendMessageRequest(message=message(QUESTION)))]
        await c.close()
        return events

    events = run(go())
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds == ["task", "artifact_update", "status_update"], kinds
    assert events[0].task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    parts = events[1].artifact_update.artifact.parts
    assert "24" in json_format.MessageToDict(parts[1].data)["answer"]
    assert events[2].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert events[2].status_update.task_id == events[0].task.id


def test_a_task_returned_at_once_can_be_cancelled_and_stays_cancelled():
    async def go():
        c = await client(streaming=False)
        req = SendMessageRequest(
            message=message("Plan the greenhouse planting schedule for the next season in detail."),
            configuration=SendMessageConfiguration(return_immediately=True),
        )
        [event] = [e async for e in c.send_message(req)]
        first = event.task
        outcome = None
        try:
            outcome = await c.cancel_task(CancelTaskRequest(id=first.id))
        except TaskNotCancelableError:
            # The swarm was quicker than the cancel; then the task is complete.
            pass
        after = await c.get_task(GetTaskRequest(id=first.id))
        await c.close()
        return first, outcome, after

    first, outcome, after = run(go())
    assert first.status.state == TaskState.TASK_STATE_WORKING
    if outcome is not None:
        assert outcome.status.state == TaskState.TASK_STATE_CANCELED
        assert after.status.state == TaskState.TASK_STATE_CANCELED
    else:
        assert after.status.state == TaskState.TASK_STATE_COMPLETED


def test_unknown_tasks_and_file_parts_are_a2a_errors():
    async def go():
        c = await client(streaming=False)
        with pytest.raises(TaskNotFoundError):
            await c.get_task(GetTaskRequest(id="no-such-task"))
        with pytest.raises(TaskNotFoundError):
            await c.cancel_task(CancelTaskRequest(id="no-such-task"))
        file_msg = Message(
            message_id="m-file",
            role=Role.ROLE_USER,
            parts=[Part(url="http://127.0.0.1/x.pdf", media_type="application/pdf")],
        )
        with pytest.raises(ContentTypeNotSupportedError) as e:
            [_ async for _ in c.send_message(SendMessageRequest(message=file_msg))]
        await c.close()
        return str(e.value)

    assert "text parts only" in run(go())


def test_malformed_json_rpc_gets_json_rpc_errors_not_http_errors():
    def post(body):
        req = urllib.request.Request(
            f"{BASE}/a2a", data=body, headers={"content-type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
            return json.load(r)

    assert post(b"{not json")["error"]["code"] == -32700
    assert post(b'{"jsonrpc": "2.0", "id": 1, "method": "Nope"}')["error"]["code"] == -32601
    old = post(b'{"jsonrpc": "2.0", "id": 2, "method": "message/send", "params": {}}')
    assert old["id"] == 2 and "A2A 0.3" in old["error"]["message"]
    bad = post(b'{"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"message": {}}}')
    assert bad["error"]["code"] == -32602 and "parts" in bad["error"]["message"]
    # A body not declared as JSON is refused before JSON-RPC, as on every route: a web page
    # cannot post it to a node without a CORS preflight.
    plain = urllib.request.Request(
        f"{BASE}/a2a",
        data=b'{"jsonrpc": "2.0", "id": 4, "method": "GetTask", "params": {"id": "x"}}',
        headers={"content-type": "text/plain"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(plain, timeout=30)
    assert e.value.code == 415
