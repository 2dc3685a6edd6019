#!/usr/bin/env python3
"""Generates the offline memory-retrieval evaluation set (deterministic).

memories.jsonl: {"id", "domain", "prompt", "answer"}; every memory's prompt comes from one
template of its domain. queries.jsonl: {"query", "domain", "relevant": [id]}: held-out
paraphrases (other wording, synonyms) of some memories' prompts, two per memory, never the
prompt itself. Same-template memories with other slot values are the distractors.

Usage: python3 gen_eval.py [OUT_DIR] [--seed N]
"""
import json, random, sys, os

DOMAINS = {
    "cooking": {
        "slots": ["rice", "pasta", "eggs", "potatoes", "broccoli", "lentils", "quinoa", "carrots",
                  "chickpeas", "salmon", "chicken breast", "shrimp", "corn on the cob", "green beans",
                  "barley", "spinach", "asparagus", "beets", "oats", "artichokes"],
        "memory": ["How long should I boil {x}?", "What temperature should I roast {x} at?"],
        "answer": ["Boil {x} for about {n} minutes.", "Roast {x} at {t} degrees C."],
        "para": [["What's the cooking time for {x} in simmering water?", "For how many minutes do {x} need to cook in the pot?"],
                 ["At what oven heat do I bake {x}?", "Which oven setting is right for baking {x}?"]],
    },
    "units": {
        "slots": ["miles to kilometres", "pounds to kilograms", "inches to centimetres",
                  "gallons to litres", "fahrenheit to celsius", "feet to metres", "ounces to grams",
                  "acres to hectares", "yards to metres", "cups to millilitres", "knots to km per hour",
                  "horsepower to kilowatts", "psi to bar", "calories to joules", "stones to kilograms"],
        "memory": ["Convert {x}.", "What is the formula to convert {x}?"],
        "answer": ["Multiply by the factor for {x}.", "Use the standard factor for {x}."],
        "para": [["I need to change a value from {x}, how?", "Turn {x} for me please."],
                 ["Which equation takes {x}?", "Give me the rule going from {x}."]],
    },
    "geography": {
        "slots": ["France", "Japan", "Kenya", "Peru", "Norway", "Vietnam", "Egypt", "Canada",
                  "Chile", "Poland", "Ghana", "Nepal", "Portugal", "Mongolia", "Morocco", "Finland",
                  "Argentina", "Thailand", "Ireland", "Hungary"],
        "memory": ["What is the capital of {x}?", "What currency is used in {x}?"],
        "answer": ["The capital of {x} is its seat of government.", "{x} uses its national currency."],
        "para": [["Which city is the seat of government of {x}?", "Name {x}'s capital city."],
                 ["What money do people pay with in {x}?", "Which notes and coins circulate in {x}?"]],
    },
    "code": {
        "slots": ["Python", "Rust", "JavaScript", "Go", "Java", "C++", "Ruby", "Kotlin", "Swift", "Haskell"],
        "memory": ["How do I reverse a list in {x}?", "How do I read a file line by line in {x}?",
                   "How do I sort a map by value in {x}?"],
        "answer": ["In {x}, use the built-in reverse.", "In {x}, open the file and iterate over lines.",
                   "In {x}, collect the entries and sort by value."],
        "para": [["{x}: invert the order of an array's elements?", "Flip a sequence backwards using {x}."],
                 ["Iterate over each row of a text document in {x}.", "{x} snippet to process a text file one row at a time."],
                 ["Order a dictionary's entries by their values with {x}.", "In {x}, rank hash table items by the stored value."]],
    },
    "format": {
        "slots": ["March 3 2021", "July 14 1999", "December 25 2010", "January 1 2000", "May 9 2018",
                  "October 31 2005", "February 29 2020", "June 6 1944", "August 15 1947", "April 22 1970",
                  "September 11 2011", "November 9 1989"],
        "memory": ["Write {x} in ISO 8601 format.", "Write {x} as a US style date with slashes."],
        "answer": ["ISO form of {x}: YYYY-MM-DD.", "US form of {x}: MM/DD/YYYY."],
        "para": [["Give {x} as YYYY-MM-DD.", "Express the day {x} using the international standard notation."],
                 ["Format {x} like MM/DD/YYYY.", "Show {x} the American way, month first, separated by slashes."]],
    },
}

def main():
    out = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else os.path.dirname(os.path.abspath(__file__))
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 7
    rng = random.Random(seed)
    memories, queries = [], []
    for domain, d in DOMAINS.items():
        ids = []
        for ti, tmpl in enumerate(d["memory"]):
            for x in d["slots"]:
                mid = f"{domain}-{ti}-{len(ids)}"
                ids.append(mid)
                ans = d["answer"][ti].format(x=x, n=rng.randint(5, 40), t=rng.choice([180, 200, 220]))
                memories.append({"id": mid, "domain": domain, "prompt": tmpl.format(x=x), "answer": ans})
                # Held-out paraphrases for about half of the memories.
                if rng.random() < 0.5:
                    for p in d["para"][ti]:
                        queries.append({"query": p.format(x=x), "domain": domain, "relevant": [mid]})
    rng.shuffle(memories)
    # Interleave so that the two paraphrases of a memory are adjacent (one per feedback half).
    with open(os.path.join(out, "memories.jsonl"), "w") as f:
        for m in memories:
            f.write(json.dumps(m) + "\n")
    with open(os.path.join(out, "queries.jsonl"), "w") as f:
        for q in queries:
            f.write(json.dumps(q) + "\n")
    print(f"{len(memories)} memories, {len(queries)} queries -> {out}")

if __name__ == "__main__":
    main()
