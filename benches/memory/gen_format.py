#!/usr/bin/env python3
"""Writes format_tasks.jsonl and format_memories.jsonl for `starling eval format`
(deterministic).

Five format rules, one domain each:
  lists   numbered_list  "Name N <things>. Reply with a numbered list only."
  json    json_keys      facts about a subject as a JSON object with named keys
  fields  line_prefixes  extraction into "Key: value" lines
  math    final_answer   a word problem whose last line must be "ANSWER: <number>"
  dates   regex          a date rewritten as YYYY-MM-DD, nothing else

Tasks {"domain", "prompt", "check"} and memories {"id", "domain", "prompt", "answer",
"check"} come from the same request families but never share a prompt: every subject (list
topic, person, date, ...) is used either by a task or by a memory, never both. Memory
answers are written to follow their rule (the evaluation re-checks them).

Usage: python3 gen_format.py [OUT_DIR]
"""
import json
import os
import sys

NUM = {2: "two", 3: "three", 4: "four", 5: "five"}

# (topic, items): the first len(items) are used.
LISTS = [
    ("colours of the rainbow", ["Red", "Orange", "Yellow", "Green", "Blue"]),
    ("planets of the solar system", ["Mercury", "Venus", "Earth", "Mars", "Jupiter"]),
    ("primary school subjects", ["Mathematics", "Reading", "Science", "Art"]),
    ("musical instruments", ["Piano", "Violin", "Flute", "Drums"]),
    ("European capitals", ["Paris", "Madrid", "Rome", "Vienna"]),
    ("kinds of trees", ["Oak", "Birch", "Maple", "Pine"]),
    ("farm animals", ["Cow", "Sheep", "Pig", "Goat"]),
    ("programming languages", ["Python", "Rust", "Java", "Go"]),
    ("breakfast foods", ["Oatmeal", "Toast", "Eggs", "Yogurt"]),
    ("sports played with a ball", ["Football", "Tennis", "Basketball", "Volleyball"]),
    ("vegetables", ["Carrot", "Potato", "Spinach", "Onion"]),
    ("ocean animals", ["Dolphin", "Octopus", "Shark", "Whale"]),
    ("things found in a kitchen", ["Stove", "Fridge", "Kettle", "Sink"]),
    ("winter clothes", ["Coat", "Scarf", "Gloves", "Boots"]),
]
LIST_COUNTS = [3, 5, 2, 4, 3, 4, 3, 2, 4, 3, 3, 4, 2, 3]

# (subject, {key: value}) for "as JSON with keys ...".
JSON = [
    ("France", {"capital": "Paris", "continent": "Europe"}),
    ("Japan", {"capital": "Tokyo", "continent": "Asia"}),
    ("Kenya", {"capital": "Nairobi", "continent": "Africa"}),
    ("Peru", {"capital": "Lima", "continent": "South America"}),
    ("Canada", {"capital": "Ottawa", "continent": "North America"}),
    ("Norway", {"capital": "Oslo", "continent": "Europe"}),
    ("Egypt", {"capital": "Cairo", "continent": "Africa"}),
    ("Vietnam", {"capital": "Hanoi", "continent": "Asia"}),
    ("Chile", {"capital": "Santiago", "continent": "South America"}),
    ("Poland", {"capital": "Warsaw", "continent": "Europe"}),
    ("water", {"formula": "H2O", "boiling_point_c": 100}),
    ("table salt", {"formula": "NaCl", "boiling_point_c": 1413}),
    ("ethanol", {"formula": "C2H6O", "boiling_point_c": 78}),
    ("ammonia", {"formula": "NH3", "boiling_point_c": -33}),
]

# (sentence, [(prefix, value)]).
FIELDS = [
    ("Maria Lopez, a nurse, lives in Valencia.", [("Name:", "Maria Lopez"), ("City:", "Valencia")]),
    ("Tom Becker works as a pilot in Hamburg.", [("Name:", "Tom Becker"), ("City:", "Hamburg")]),
    ("Aiko Tanaka designs houses in Osaka.", [("Name:", "Aiko Tanaka"), ("City:", "Osaka")]),
    ("Samuel Okafor teaches history in Lagos.", [("Name:", "Samuel Okafor"), ("City:", "Lagos")]),
    ("Ingrid Nilsson runs a lab in Uppsala.", [("Name:", "Ingrid Nilsson"), ("City:", "Uppsala")]),
    ("Rahul Mehta studies law in Pune.", [("Name:", "Rahul Mehta"), ("City:", "Pune")]),
    ("Chloe Martin bakes bread in Lyon.", [("Name:", "Chloe Martin"), ("City:", "Lyon")]),
    ("The Hobbit was written by J. R. R. Tolkien in 1937.",
     [("Title:", "The Hobbit"), ("Author:", "J. R. R. Tolkien"), ("Year:", "1937")]),
    ("Beloved was written by Toni Morrison in 1987.",
     [("Title:", "Beloved"), ("Author:", "Toni Morrison"), ("Year:", "1987")]),
    ("Dune was written by Frank Herbert in 1965.",
     [("Title:", "Dune"), ("Author:", "Frank Herbert"), ("Year:", "1965")]),
    ("Emma was written by Jane Austen in 1815.",
     [("Title:", "Emma"), ("Author:", "Jane Austen"), ("Year:", "1815")]),
    ("The Trial was written by Franz Kafka in 1925.",
     [("Title:", "The Trial"), ("Author:", "Franz Kafka"), ("Year:", "1925")]),
    ("Diego Ferreira repairs cars in Porto.", [("Name:", "Diego Ferreira"), ("City:", "Porto")]),
    ("Middlemarch was written by George Eliot in 1871.",
     [("Title:", "Middlemarch"), ("Author:", "George Eliot"), ("Year:", "1871")]),
]

# (problem, working, answer).
MATH = [
    ("Anna has 12 apples and buys 7 more.", "12 + 7 = 19", 19),
    ("A box holds 6 eggs. How many eggs are in 8 boxes?", "6 x 8 = 48", 48),
    ("Tom had 50 dollars and spent 18.", "50 - 18 = 32", 32),
    ("36 sweets are shared equally among 4 children. How many does each get?", "36 / 4 = 9", 9),
    ("A bus carries 23 people and 15 more get on.", "23 + 15 = 38", 38),
    ("A garden has 7 rows of 9 plants. How many plants are there?", "7 x 9 = 63", 63),
    ("A rope is 80 cm long and 25 cm is cut off. How long is the rest?", "80 - 25 = 55", 55),
    ("45 pencils are packed 5 to a box. How many boxes are filled?", "45 / 5 = 9", 9),
    ("A shop sells 14 cakes in the morning and 19 in the afternoon.", "14 + 19 = 33", 33),
    ("A car uses 6 litres of fuel per 100 km. How much for 300 km?", "6 x 3 = 18", 18),
    ("Sara read 120 pages and has 45 pages left. How long is the book?", "120 + 45 = 165", 165),
    ("A class of 28 pupils splits into teams of 4. How many teams?", "28 / 4 = 7", 7),
    ("A ticket costs 12 dollars. How much do 5 tickets cost?", "12 x 5 = 60", 60),
    ("A tank holds 90 litres and 35 litres are used.", "90 - 35 = 55", 55),
]
MATH_QUESTION = {  # problems stated without a question get one
    0: "How many apples does she have now?", 2: "How much money is left?",
    4: "How many people are on the bus?", 8: "How many cakes were sold in total?",
    13: "How many litres are left?",
}

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
DATES = [(5, 3, 2024), (17, 11, 1989), (1, 1, 2000), (29, 2, 2016), (12, 7, 1969),
         (23, 9, 2031), (8, 5, 1945), (30, 6, 2010), (14, 2, 2022), (3, 10, 1990),
         (21, 12, 2012), (9, 4, 1975), (26, 8, 2005), (11, 1, 2019)]


def lists():
    out = []
    for (topic, items), n in zip(LISTS, LIST_COUNTS):
        prompt = f"Name {NUM[n]} {topic}. Reply with a numbered list only."
        answer = "\n".join(f"{i + 1}. {x}" for i, x in enumerate(items[:n]))
        out.append(("lists", prompt, answer, {"type": "numbered_list", "items": n}))
    return out


def jsons():
    out = []
    for subject, obj in JSON:
        keys = list(obj)
        prompt = (f"Give facts about {subject} as a JSON object with exactly the keys "
                  f"{' and '.join(json.dumps(k) for k in keys)}. Reply with the JSON only.")
        out.append(("json", prompt, json.dumps(obj), {"type": "json_keys", "keys": keys}))
    return out


def fields():
    out = []
    for sentence, kv in FIELDS:
        prefixes = [p for p, _ in kv]
        shown = ", ".join(f"'{p} ...'" for p in prefixes)
        prompt = (f"Extract the fields from: \"{sentence}\" Reply with {NUM[len(kv)]} lines, "
                  f"{shown}, and nothing else.")
        answer = "\n".join(f"{p} {v}" for p, v in kv)
        out.append(("fields", prompt, answer, {"type": "line_prefixes", "prefixes": prefixes}))
    return out


def maths():
    out = []
    for i, (problem, working, answer) in enumerate(MATH):
        question = f"{problem} {MATH_QUESTION[i]}" if i in MATH_QUESTION else problem
        prompt = f"{question} Show the working, then end with a line 'ANSWER: <number>'."
        out.append(("math", prompt, f"{working}\nANSWER: {answer}",
                    {"type": "final_answer", "value": str(answer)}))
    return out


def dates():
    out = []
    for d, m, y in DATES:
        prompt = (f"Write the date {d} {MONTHS[m - 1]} {y} in ISO format (YYYY-MM-DD). "
                  f"Reply with the date only.")
        out.append(("dates", prompt, f"{y:04d}-{m:02d}-{d:02d}",
                    {"type": "regex", "pattern": r"\d{4}-\d{2}-\d{2}"}))
    return out


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    tasks, memories = [], []
    for family in (lists(), jsons(), fields(), maths(), dates()):
        # Alternate subjects: odd positions are memories (5 per rule), the rest tasks (9).
        for i, (domain, prompt, answer, check) in enumerate(family):
            if i % 2 == 1 and i < 10:
                memories.append({"id": f"{domain}-{i}", "domain": domain, "prompt": prompt,
                                 "answer": answer, "check": check})
            else:
                # Format only: the value is not part of the task's rule.
                check = {k: v for k, v in check.items() if k != "value"}
                tasks.append({"domain": domain, "prompt": prompt, "check": check})
    task_prompts = {t["prompt"] for t in tasks}
    assert not any(m["prompt"] in task_prompts for m in memories)
    with open(os.path.join(out_dir, "format_tasks.jsonl"), "w") as f:
        for t in tasks:
            f.write(json.dumps(t) + "\n")
    with open(os.path.join(out_dir, "format_memories.jsonl"), "w") as f:
        for m in memories:
            f.write(json.dumps(m) + "\n")
    print(f"wrote {len(tasks)} tasks and {len(memories)} memories to {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
