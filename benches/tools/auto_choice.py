"""How `tool_choice: "auto"` decides between calling a tool and answering (issue 15).

Sends 36 prompts that want one of the offered tools (drawn from bench.py's 240) and 24 that
want none (general questions, chit-chat), each with three tools offered, to a running
`starling serve`, and compares two ways of deciding:

- A, `auto` as served: the tools with `tool_choice: "auto"`; the grammar lets the model
  write a call or a plain answer, and the model's first characters decide.
- B, an explicit choice: a system message listing the tools (names and descriptions) and the
  question, answered under an enum constraint: one tool's name, or `answer`.

- C, embedding similarity (no decision rule, a measurement for one): the served embedding
  model's cosine between the question and each offered tool's `name: description`. Reports
  how often the most similar tool is the wanted one, and how well the best similarity tells
  prompts that want a tool from those that do not (ROC AUC: 0.5 is chance, 1 perfect).

Prints how often A and B called a tool when one was wanted, named the wanted tool, and
answered when none was wanted, and C's figures.

    starling serve --api 127.0.0.1:7431 &
    python3 benches/tools/auto_choice.py --base http://127.0.0.1:7431/v1
"""

import argparse
import json
import os
import random
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

NO_TOOL = [
    "What is the capital of Italy?", "Tell me a joke.", "Write a haiku about autumn.", "How are you today?",
    "What is 12 times 7?", "Explain photosynthesis in one sentence.", "Who wrote Hamlet?", "Give me a synonym for happy.",
    "What does CPU stand for?", "Say hello in a friendly way.", "Summarise the plot of Cinderella in two sentences.",
    "Is a tomato a fruit?", "What colour do you get mixing blue and yellow?", "Define the word 'ephemeral'.",
    "How many legs does a spider have?", "Thank you, that's all.", "What's your name?", "Name three primary colours.",
    "Why is the sky blue?", "Write one sentence about dogs.", "What is the boiling point of water in Celsius?",
    "Spell 'necessary' backwards.", "What is the plural of mouse?", "Recommend a good habit for mornings.",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    base = ap.parse_args().base

    def post(body, path="/chat/completions"):
        req = urllib.request.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.load(r)

    def embed(texts):
        r = post({"input": texts, "encoding_format": "float"}, "/embeddings")
        return [d["embedding"] for d in r["data"]]

    scored = []  # (best similarity, a tool was wanted)
    c_right = 0

    random.seed(1)
    tools = [bench.tool_json(*t) for t in bench.TOOLS]
    byname = {t["function"]["name"]: t for t in tools}
    want = []
    for name, phrases in bench.PHRASES.items():
        for i, p in enumerate(phrases):
            want.append((p.format(*bench.FILL[i % 5]), name))
    random.shuffle(want)
    want = want[:36]
    cases = [(q, n) for q, n in want] + [(q, None) for q in NO_TOOL]
    res = {"A": [0, 0, 0, 0], "B": [0, 0, 0, 0]}  # tool-wanted called, tool-wanted right tool, no-tool answered, -
    for q, name in cases:
        others = random.sample([t for t in tools if t["function"]["name"] != name], 2 if name else 3)
        offered = ([byname[name]] if name else []) + others
        random.shuffle(offered)
        names = [t["function"]["name"] for t in offered]
        vecs = embed([q] + [f"{t['function']['name']}: {t['function']['description']}" for t in offered])
        sims = [sum(x * y for x, y in zip(vecs[0], v)) for v in vecs[1:]]
        best = max(range(len(sims)), key=sims.__getitem__)
        scored.append((sims[best], name is not None))
        c_right += name is not None and names[best] == name
        # A: auto as it is
        r = post({"messages": [{"role": "user", "content": q}], "tools": offered, "temperature": 0, "max_tokens": 80})
        calls = r["choices"][0]["message"].get("tool_calls") or []
        a = calls[0]["function"]["name"] if calls else None
        # B: a choice among the tools and answering
        sys_text = "You decide how to handle the user's message. Tools:\n" + "\n".join(
            f"- {t['function']['name']}: {t['function']['description']}" for t in offered) + \
            "\nIf one of these tools does what the user asks, reply with its name. If no tool fits, reply with answer."
        r = post({"messages": [{"role": "system", "content": sys_text}, {"role": "user", "content": q}], "temperature": 0, "max_tokens": 20,
                  "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": {"enum": names + ["answer"]}}}})
        b = json.loads(r["choices"][0]["message"]["content"])
        b = None if b == "answer" else b
        for k, got in (("A", a), ("B", b)):
            if name:
                res[k][0] += got is not None
                res[k][1] += got == name
            else:
                res[k][2] += got is None
        print(f"{q[:40]:40} want={name} A={a} B={b}", file=sys.stderr)
    pos = [x for x, w in scored if w]
    neg = [x for x, w in scored if not w]
    auc = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    print(json.dumps({"C": {"most_similar_is_wanted": c_right, "auc_wanted_vs_not": round(auc, 3)}}))
    print(json.dumps({"tool_wanted": len(want), "no_tool": len(NO_TOOL), **{k: dict(called=v[0], right_tool=v[1], answered_no_tool=v[2]) for k, v in res.items()}}))


if __name__ == "__main__":
    main()
