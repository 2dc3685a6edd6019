"""Tool-call validity with and without the constraint, against a running `starling serve`.

For each of the prompts below (12 tools, 240 requests in varied wording), it asks the model
for a call twice, with the same prompt text:

- constrained: `tools` + `tool_choice: "required"` through the API (the server writes the
  call under a schema built from the tool's parameters);
- unconstrained: the same system text (the tool list and the call format, as
  `node/src/api/tools.rs` writes it) and user message, with no tools and no grammar, and
  the reply parsed as a call.

A call is valid when it parses, names a tool of the request and its arguments validate
against that tool's schema (the `jsonschema` package). It also reports the completion
tokens per second of both, the constraint's per-token cost.

Usage: python3 benches/tools/bench.py --base http://127.0.0.1:7431/v1 [--limit N] [--json OUT]
"""

import argparse
import itertools
import json
import sys
import time
import urllib.request

import jsonschema

S = {"type": "string", "maxLength": 60}
TOOLS = [
    ("get_weather", "Current weather in a city.", {"city": S}, ["city"]),
    ("convert_currency", "Convert an amount of money.", {"amount": {"type": "number"}, "from": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]}, "to": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]}}, ["amount", "from", "to"]),
    ("set_timer", "Start a countdown timer.", {"minutes": {"type": "integer", "minimum": 1, "maximum": 600}, "label": S}, ["minutes"]),
    ("send_email", "Send an email.", {"to": S, "subject": S, "body": {"type": "string", "maxLength": 200}}, ["to", "subject", "body"]),
    ("search_web", "Search the web.", {"query": S, "max_results": {"type": "integer", "minimum": 1, "maximum": 20}}, ["query"]),
    ("add_calendar_event", "Add an event to the calendar.", {"title": S, "date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"}, "time": {"type": "string", "pattern": "^\\d{2}:\\d{2}$"}}, ["title", "date"]),
    ("translate", "Translate text.", {"text": {"type": "string", "maxLength": 200}, "target_language": {"type": "string", "enum": ["French", "German", "Spanish", "Italian", "Japanese"]}}, ["text", "target_language"]),
    ("get_stock_price", "Latest price of a stock.", {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}, ["ticker"]),
    ("book_table", "Book a restaurant table.", {"restaurant": S, "people": {"type": "integer", "minimum": 1, "maximum": 20}, "time": {"type": "string", "pattern": "^\\d{2}:\\d{2}$"}}, ["restaurant", "people", "time"]),
    ("play_music", "Play music.", {"artist": S, "shuffle": {"type": "boolean"}}, ["artist"]),
    ("create_note", "Save a note.", {"title": S, "text": {"type": "string", "maxLength": 200}, "tags": {"type": "array", "items": S, "maxItems": 5}}, ["title", "text"]),
    ("turn_on_lights", "Switch lights on in a room.", {"room": {"type": "string", "enum": ["kitchen", "bedroom", "living room", "office", "bathroom"]}, "brightness": {"type": "integer", "minimum": 0, "maximum": 100}}, ["room"]),
]
PHRASES = {
    "get_weather": ["What's the weather in {0}?", "Is it raining in {0} right now?", "Tell me the temperature in {0}.", "Do I need a coat in {0} today?"],
    "convert_currency": ["Convert {1} euros to dollars.", "How many yen is {1} USD?", "What is {1} GBP in EUR?", "Change {1} dollars into pounds."],
    "set_timer": ["Set a timer for {1} minutes.", "Remind me in {1} minutes to check the oven.", "Start a {1}-minute countdown.", "Timer: {1} min for tea."],
    "send_email": ["Email {2} that the meeting moved to Friday.", "Send {2} a note saying thanks for lunch.", "Write to {2}: the report is ready.", "Tell {2} by email I'll be late."],
    "search_web": ["Search the web for {3}.", "Look up {3} online.", "Find me pages about {3}.", "What does the internet say about {3}?"],
    "add_calendar_event": ["Put '{3}' in my calendar on 2026-12-0{4}.", "Add {3} to the calendar for December {4}.", "Schedule {3} on 2026-12-1{4} at 10:00.", "Calendar: {3}, 2027-01-0{4}."],
    "translate": ["Translate '{3}' into French.", "How do you say '{3}' in German?", "Give me '{3}' in Spanish.", "Say '{3}' in Japanese."],
    "get_stock_price": ["What's {5} trading at?", "Price of {5} stock?", "How is {5} doing today?", "Quote for ticker {5}."],
    "book_table": ["Book a table for {4} at {0} Bistro at 19:30.", "Reserve {4} seats at Luigi's tonight at 20:00.", "Table for {4} at The Oak, 18:45.", "Get us a table for {4} at Sakura at 21:00."],
    "play_music": ["Play some {6}.", "Put on {6}, shuffled.", "I want to hear {6}.", "Music by {6}, please."],
    "create_note": ["Note: buy {3} tomorrow.", "Save a note titled shopping: {3}.", "Remember that {3} is due Monday.", "Write down: call {2} about {3}."],
    "turn_on_lights": ["Turn on the kitchen lights.", "Lights on in the bedroom at {1} percent.", "Switch on the office lamp.", "Make the living room bright."],
}
FILL = [
    ("Paris", "50", "anna@example.org", "cheap flights", "3", "AAPL", "Miles Davis"),
    ("Oslo", "120", "ben@example.org", "sourdough starter", "5", "MSFT", "Nina Simone"),
    ("Lagos", "15", "chen@example.org", "the printer manual", "7", "TSLA", "Bach"),
    ("Lima", "9", "dara@example.org", "a birthday gift", "2", "NVDA", "Daft Punk"),
    ("Kyoto", "300", "eli@example.org", "bike repair", "8", "IBM", "Fela Kuti"),
]


def tool_json(name, description, props, required):
    params = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def instructions(tools):
    """The system text the server writes for `required` (node/src/api/tools.rs)."""
    lines = ["You can call these tools:"]
    for t in tools:
        f = t["function"]
        lines.append(f"- {f['name']}: {f['description'].strip()} Arguments (JSON Schema): {json.dumps(f['parameters'], separators=(',', ':'))}")
    text = "\n".join(lines) + "\n"
    return text + 'To call tools, reply with only a JSON object: {"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}. Call at least one tool now.'


def post(base, body):
    req = urllib.request.Request(base + "/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.load(r)
    return out, time.monotonic() - started


def valid(calls, tools):
    """calls: list of (name, arguments-as-value)."""
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if not calls:
        return False
    for name, args in calls:
        if name not in by_name:
            return False
        try:
            jsonschema.validate(args, by_name[name])
        except jsonschema.ValidationError:
            return False
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    tools = [tool_json(*t) for t in TOOLS]
    # Every request offers three tools: the one the prompt is about and two others.
    cases = []
    for i, (name, phrases) in enumerate(PHRASES.items()):
        offered = [tools[i], tools[(i + 3) % len(tools)], tools[(i + 7) % len(tools)]]
        for phrase, fill in itertools.product(phrases, FILL):
            cases.append((phrase.format(*fill), offered, name))
    if a.limit:
        cases = cases[: a.limit]
    stats = {k: {"valid": 0, "right_tool": 0, "cut": 0, "tokens": 0, "seconds": 0.0} for k in ("constrained", "unconstrained")}
    for done, (prompt, offered, want) in enumerate(cases):
        if done % 40 == 0:
            print(f"{done}/{len(cases)}", file=sys.stderr, flush=True)
        # Room for the longest call the schemas allow (three strings of up to 200 characters).
        body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 600}
        out, secs = post(a.base, dict(body, tools=offered, tool_choice="required"))
        msg = out["choices"][0]["message"]
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
        s = stats["constrained"]
        s["cut"] += out["choices"][0]["finish_reason"] == "length"
        s["valid"] += valid(calls, offered)
        s["right_tool"] += bool(calls) and calls[0][0] == want
        s["tokens"] += out["usage"]["completion_tokens"]
        s["seconds"] += secs
        # Without the grammar a call ends by itself or not at all: 300 tokens is room for any
        # call the model would finish (and keeps rambling replies from taking the run's time).
        free = dict(body, max_tokens=300, messages=[{"role": "system", "content": instructions(offered)}] + body["messages"])
        out, secs = post(a.base, free)
        text = out["choices"][0]["message"]["content"] or ""
        try:
            parsed = json.loads(text.strip())
            calls = [(c["name"], c["arguments"]) for c in parsed["tool_calls"]]
        except (ValueError, KeyError, TypeError):
            calls = []
        s = stats["unconstrained"]
        s["cut"] += out["choices"][0]["finish_reason"] == "length"
        s["valid"] += valid(calls, offered)
        s["right_tool"] += bool(calls) and calls[0][0] == want
        s["tokens"] += out["usage"]["completion_tokens"]
        s["seconds"] += secs
    n = len(cases)
    print(f"{n} prompts, 3 tools offered in each, temperature 0")
    print("| | valid calls | right tool first | cut by max_tokens | completion tokens/s |")
    print("|---|---|---|---|---|")
    for k, s in stats.items():
        print(f"| {k} | {s['valid']}/{n} ({100 * s['valid'] / n:.1f}%) | {s['right_tool']}/{n} ({100 * s['right_tool'] / n:.1f}%) | {s['cut']} | {s['tokens'] / s['seconds']:.1f} |")
    if a.json:
        json.dump({"n": n, **stats}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
