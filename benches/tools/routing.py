"""How `tool_choice: "auto"` decides between calling a tool and answering, and which tool
`tool_choice: "required"` calls, as served (issue 15).

Reads a JSON Lines file of requests (`{"id", "tools": [{"name", "description",
"parameters"}], "prompt", "want": tool name or null}`, e.g. `routing_blind.jsonl`), sends each
to a running `starling serve` with its tools and `tool_choice: "auto"`, and counts:

- `called` / `right_tool`: of the prompts that want a tool, how many got a call, and how many
  a call of the wanted tool first;
- `answered`: of the prompts that want none, how many got a plain answer;
- `right_decisions`: right tool called or rightly answered, over all prompts;
- `valid_arguments`: calls whose arguments validate against the called tool's schema.

With `--tool-choice required` only the prompts that want a tool are sent (a call is forced,
so there is no answer to count) and `right_tool` is the measure.

Run it once against a server started with the router (the default) and once with
`--no-tool-router` to compare with the chat model deciding alone:

    starling serve --api 127.0.0.1:7431 &
    python3 benches/tools/routing.py --base http://127.0.0.1:7431/v1 --data benches/tools/routing_blind.jsonl
    python3 benches/tools/routing.py --tool-choice required --base ... --data ...
"""

import argparse
import json
import sys
import urllib.request

import jsonschema


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--tool-choice", choices=["auto", "required"], default="auto")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.data) if line.strip()]
    if args.tool_choice == "required":
        rows = [r for r in rows if r["want"]]
    counts = dict(tool_wanted=0, called=0, right_tool=0, no_tool=0, answered=0, calls=0, valid_arguments=0)
    for r in rows:
        tools = [{"type": "function", "function": t} for t in r["tools"]]
        body = {"messages": [{"role": "user", "content": r["prompt"]}], "tools": tools,
                "tool_choice": args.tool_choice, "temperature": 0, "max_tokens": args.max_tokens}
        req = urllib.request.Request(args.base + "/chat/completions", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            msg = json.load(resp)["choices"][0]["message"]
        calls = msg.get("tool_calls") or []
        got = calls[0]["function"]["name"] if calls else None
        schemas = {t["name"]: t.get("parameters") or {} for t in r["tools"]}
        for c in calls:
            counts["calls"] += 1
            try:
                jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])
                counts["valid_arguments"] += 1
            except (KeyError, ValueError, jsonschema.ValidationError):
                pass
        if r["want"]:
            counts["tool_wanted"] += 1
            counts["called"] += got is not None
            counts["right_tool"] += got == r["want"]
        else:
            counts["no_tool"] += 1
            counts["answered"] += got is None
        print(f"{r['id']}: want={r['want']} got={got}", file=sys.stderr)
    counts["right_decisions"] = counts["right_tool"] + counts["answered"]
    counts["prompts"] = len(rows)
    counts["tool_choice"] = args.tool_choice
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
