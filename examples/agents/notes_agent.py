#!/usr/bin/env python3
"""An external agent for a Starling node, reached as a command (docs/agents.md).

It reads one task as JSON on stdin and answers from its own notes: the note that shares
the most words with the task's description, as `{"result": ..., "ok": true}` on stdout; a task no note
matches is a failure (`{"ok": false, "error": ...}`), so the node knows nothing was found.
Standard library only. Configure it on a node:

    [[agent.external]]
    name = "station_notes"
    description = "Knows the station's maintenance notes: filters, pumps, inspections."
    command = ["python3", "examples/agents/notes_agent.py"]
"""

import json
import re
import sys

NOTES = [
    "The north greenhouse air filters were replaced on 12 March; the next change is due on 12 June.",
    "Pump P-7 in the irrigation loop runs at 40 litres per minute and is inspected every Monday.",
    "The hydroponic bay's nutrient tanks hold 220 litres each and are flushed every 14 days.",
]

STOP = {"the", "a", "an", "is", "are", "was", "of", "in", "on", "at", "to", "and", "what",
        "when", "which", "who", "how", "does", "do", "for", "it", "its", "by", "with"}


def words(text):
    return {w for w in re.findall(r"[a-z0-9-]+", text.lower()) if w not in STOP}


def answer(task):
    # The description says what is asked; the context is background and matches too much.
    asked = words(task.get("description", ""))
    best, overlap = None, 0
    for note in NOTES:
        n = len(asked & words(note))
        if n > overlap:
            best, overlap = note, n
    if best is None:
        return {"ok": False, "error": "no note matches the task"}
    return {"ok": True, "result": best}


def main():
    try:
        task = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        print(json.dumps({"ok": False, "error": f"the task is not JSON: {e}"}))
        return
    print(json.dumps(answer(task)))


if __name__ == "__main__":
    main()
