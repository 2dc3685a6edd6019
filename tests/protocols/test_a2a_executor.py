"""A node whose executor is an A2A agent (run by tests/protocols/run.sh).

eve fronts notes_a2a_server.py, an agent built with the official a2a-sdk server, with
`executor = "external:notes"` and `a2a = URL`. Its card advertises the agent; a question
none of the swarm's documents hold, asked of ada, goes to that agent as asked, and its
answer comes back unchanged, cited as eve's agent.
"""

import json
import os
import time
import urllib.parse
import urllib.request

ADA = "http://" + os.environ["STARLING_API"]
EVE = "http://" + os.environ["STARLING_EVE_API"]
LOG = os.environ["STARLING_NOTES_LOG"]
PUMP_NOTE = "Pump P-7 in the irrigation loop runs at 40 litres per minute and is inspected every Monday."


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=60) as r:
        return json.load(r)


def ask(base, task):
    body = json.dumps({"task": task, "wait": True}).encode()
    req = urllib.request.Request(
        base + "/api/tasks", data=body, headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.load(r)


def logged():
    if not os.path.exists(LOG):
        return []
    return [json.loads(line) for line in open(LOG).read().splitlines()]


def eve_card_at_ada():
    eve = get(EVE, "/api/node")["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        q = urllib.parse.quote("maintenance notes")
        for hit in get(ADA, f"/api/cards?q={q}&k=10"):
            if hit["card"]["node_id"] == eve:
                return hit["card"]["card"]
        time.sleep(0.5)
    raise AssertionError("ada never learned eve's card")


def test_the_card_advertises_the_a2a_agent():
    card = eve_card_at_ada()
    assert card["agent"] == "notes", card
    assert card["description"].startswith("Knows the station's maintenance notes"), card
    assert card["skills"] == ["maintenance", "irrigation pumps"], card


def test_a_question_no_document_holds_goes_to_the_a2a_agent_verbatim():
    eve_card_at_ada()
    before = len(logged())
    q = "How often is pump P-7 inspected?"
    result = ask(ADA, q)
    assert result["answer"] == PUMP_NOTE, result
    assert result["status"] == "answered", result
    [c] = result["citations"]
    assert (c["node"], c["agent"], c["document"]) == ("eve", "notes", ""), c
    assert "eve" in result["members"], result
    sent = logged()[before:]
    assert [s["text"] for s in sent] == [q], sent


def test_a_question_the_documents_answer_stays_with_them():
    before = len(logged())
    result = ask(ADA, "At what temperature do moonflower seeds germinate best?")
    assert result["status"] == "answered", result
    assert "24" in result["answer"], result
    assert all("agent" not in c for c in result["citations"]), result
    assert logged()[before:] == [], "the agent was asked although basil's documents answer"
