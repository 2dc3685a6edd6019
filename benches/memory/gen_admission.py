#!/usr/bin/env python3
"""Writes admission_pairs.jsonl: good prompt-answer pairs {"domain", "prompt", "answer"} for
`starling eval admission` (deterministic).

Four domains, one per admission rubric: math (word problems with computed, correct answers),
format (extraction into a stated format, values taken from the source text), code (short,
correct snippets) and general (factual explanations). Every answer is complete and correct,
and long enough (several words) for the evaluation to cut it mid-sentence.

Usage: python3 gen_admission.py [OUT_FILE] [--seed N]
"""
import json
import os
import random
import sys


def math_pairs(rng):
    out = []
    for _ in range(4):
        a, b = rng.randint(12, 89), rng.randint(12, 89)
        out.append((f"What is {a} times {b}?",
                    f"{a} x {b} = {a * b}. The product is {a * b}."))
    for _ in range(4):
        price = rng.choice([40, 60, 80, 120, 150, 200, 250])
        pct = rng.choice([10, 15, 20, 25, 30])
        off = price * pct // 100
        out.append((f"A jacket costs ${price} and is on sale at {pct}% off. What is the sale price?",
                    f"The discount is {pct}% of ${price}, which is ${off}. "
                    f"The sale price is {price} - {off} = ${price - off}."))
    for _ in range(4):
        speed, hours = rng.choice([45, 60, 75, 80, 90]), rng.randint(2, 6)
        out.append((f"A train travels at {speed} km/h for {hours} hours. How far does it go?",
                    f"Distance is speed times time: {speed} km/h x {hours} h = {speed * hours} km. "
                    f"The train travels {speed * hours} km."))
    for _ in range(4):
        n = rng.randint(4, 5)
        xs = [rng.randint(2, 40) for _ in range(n)]
        while sum(xs) % n:
            xs[-1] += 1
        listed = ", ".join(map(str, xs[:-1])) + f" and {xs[-1]}"
        out.append((f"What is the average of {listed}?",
                    f"The sum is {sum(xs)} and there are {n} numbers, "
                    f"so the average is {sum(xs)} / {n} = {sum(xs) // n}."))
    return [("math", p, a) for p, a in out]


PEOPLE = [
    ("Maria Lopez", 34, "nurse", "Valencia"), ("Tom Becker", 51, "pilot", "Hamburg"),
    ("Aiko Tanaka", 28, "architect", "Osaka"), ("Samuel Okafor", 45, "teacher", "Lagos"),
    ("Ingrid Nilsson", 39, "chemist", "Uppsala"), ("Rahul Mehta", 23, "student", "Pune"),
    ("Chloe Martin", 62, "baker", "Lyon"), ("Diego Ferreira", 31, "mechanic", "Porto"),
]
BOOKS = [
    ("The Hobbit", "J. R. R. Tolkien", 1937), ("Beloved", "Toni Morrison", 1987),
    ("Dune", "Frank Herbert", 1965), ("Things Fall Apart", "Chinua Achebe", 1958),
    ("The Trial", "Franz Kafka", 1925), ("Emma", "Jane Austen", 1815),
    ("Ulysses", "James Joyce", 1922), ("Middlemarch", "George Eliot", 1871),
]


def format_pairs():
    out = []
    for name, age, job, city in PEOPLE:
        text = f"{name} is a {age}-year-old {job} who lives in {city}."
        out.append((f"Extract the person from this sentence as JSON with keys name, age and job: "
                    f"\"{text}\"",
                    json.dumps({"name": name, "age": age, "job": job})))
    for title, author, year in BOOKS:
        text = f"{author} published {title} in {year}."
        out.append((f"From the sentence \"{text}\" give three lines: Title: ..., Author: ..., Year: ...",
                    f"Title: {title}\nAuthor: {author}\nYear: {year}"))
    return [("format", p, a) for p, a in out]


CODE = [
    ("Write a Python function that returns the factorial of n.",
     "```python\ndef factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n```\n"
     "It multiplies every integer from 2 to n; factorial(0) and factorial(1) return 1."),
    ("How do I reverse a string in Python?",
     "Use slicing with a step of -1: `reversed_text = text[::-1]`. For example, \"abc\"[::-1] is \"cba\"."),
    ("Write a Rust function that returns the largest element of a slice of i32.",
     "```rust\nfn largest(xs: &[i32]) -> Option<i32> {\n    xs.iter().copied().max()\n}\n```\n"
     "It returns None for an empty slice, so the caller decides what an empty input means."),
    ("How do I read a whole file into a string in Rust?",
     "Use `std::fs::read_to_string`: `let text = std::fs::read_to_string(\"notes.txt\")?;` "
     "It returns an io::Result<String>, so handle or propagate the error."),
    ("Write a JavaScript function that checks whether a number is even.",
     "```javascript\nfunction isEven(n) {\n  return n % 2 === 0;\n}\n```\n"
     "The remainder of an even number divided by 2 is zero, so isEven(4) is true and isEven(7) is false."),
    ("How do I remove duplicates from a list in Python while keeping the order?",
     "Use a dict, which keeps insertion order: `unique = list(dict.fromkeys(items))`. "
     "For [3, 1, 3, 2, 1] this gives [3, 1, 2]."),
    ("How do I count the lines of a file in a Unix shell?",
     "Run `wc -l < file.txt`. It prints the number of newline characters, which is the line count "
     "when the file ends with a newline."),
    ("Write a SQL query that counts the orders of each customer in a table orders(customer_id, id).",
     "```sql\nSELECT customer_id, COUNT(*) AS orders\nFROM orders\nGROUP BY customer_id;\n```\n"
     "GROUP BY makes one row per customer and COUNT(*) counts the rows in each group."),
    ("How do I sort a list of dictionaries by the key 'age' in Python?",
     "Pass a key function to sorted: `people_sorted = sorted(people, key=lambda p: p[\"age\"])`. "
     "Add reverse=True to sort from oldest to youngest."),
    ("Write a Python function that checks whether a word is a palindrome.",
     "```python\ndef is_palindrome(word):\n    w = word.lower()\n    return w == w[::-1]\n```\n"
     "It compares the lowercased word with its reverse, so is_palindrome(\"Level\") is True."),
    ("How do I create a vector with the numbers 1 to 10 in Rust?",
     "Collect a range: `let v: Vec<u32> = (1..=10).collect();` The inclusive range 1..=10 "
     "includes 10, while 1..10 would stop at 9."),
    ("How do I get the current date in JavaScript as YYYY-MM-DD?",
     "Use `new Date().toISOString().slice(0, 10)`. Note that toISOString uses UTC, so near "
     "midnight the date can differ from the local one."),
    ("Write a Python list comprehension that squares the even numbers of a list nums.",
     "`squares = [n * n for n in nums if n % 2 == 0]` keeps only the even numbers and squares each "
     "one; for [1, 2, 3, 4] it gives [4, 16]."),
    ("How do I find all files named *.log under a directory in a Unix shell?",
     "Run `find /path/to/dir -type f -name '*.log'`. The quotes stop the shell from expanding "
     "the pattern before find sees it."),
    ("How do I parse a JSON string into an object in JavaScript?",
     "Call `JSON.parse`: `const data = JSON.parse(text);` It throws a SyntaxError on invalid "
     "JSON, so wrap it in try/catch when the input is untrusted."),
    ("Write a Rust function that sums the even numbers of a slice of u64.",
     "```rust\nfn sum_even(xs: &[u64]) -> u64 {\n    xs.iter().filter(|&&x| x % 2 == 0).sum()\n}\n```\n"
     "filter keeps the even values and sum adds them; an empty slice gives 0."),
]

GENERAL = [
    ("Why is the sky blue?",
     "Sunlight is scattered by the molecules of the air, and short blue wavelengths scatter much "
     "more than red ones (Rayleigh scattering). Scattered blue light reaches us from every "
     "direction, so the sky looks blue."),
    ("What causes the seasons on Earth?",
     "Earth's axis is tilted about 23.4 degrees, so during the year each hemisphere is in turn "
     "tilted towards the Sun. The tilted hemisphere gets more direct sunlight and longer days, "
     "which makes its summer."),
    ("How do vaccines protect people from disease?",
     "A vaccine shows the immune system a harmless form or part of a germ. The body makes "
     "antibodies and memory cells against it, so a later real infection is fought off quickly."),
    ("Why do we have leap years?",
     "A year on Earth lasts about 365.2422 days, not 365. Adding a day every four years, except "
     "most century years, keeps the calendar in step with the seasons."),
    ("What is photosynthesis?",
     "Photosynthesis is how plants, algae and some bacteria make sugar from carbon dioxide and "
     "water using the energy of light. Oxygen is released as a by-product."),
    ("Why does ice float on water?",
     "When water freezes, its molecules form an open hexagonal lattice held by hydrogen bonds. "
     "Ice is therefore about 9% less dense than liquid water, so it floats."),
    ("What is the difference between weather and climate?",
     "Weather is the state of the atmosphere at a given time and place, such as today's rain. "
     "Climate is the average pattern of weather in a region over decades."),
    ("How does a refrigerator keep food cold?",
     "A refrigerant is pumped around a closed loop. It evaporates inside the fridge, absorbing "
     "heat, and is compressed and condensed outside at the back, releasing that heat to the room."),
    ("Why do cats purr?",
     "Cats purr by rapidly twitching the muscles of the larynx as they breathe in and out. They "
     "purr when content, but also when stressed or hurt, so it is partly a way to calm themselves."),
    ("What does a central bank do?",
     "A central bank manages a country's money: it sets the main interest rate, issues currency, "
     "supervises banks and lends to them in a crisis, mainly to keep inflation low and stable."),
    ("Why is the Dead Sea so salty?",
     "The Dead Sea has no outlet: rivers bring dissolved salts in, and the water only leaves by "
     "evaporation in the hot, dry climate. The salts stay behind, so the water is about 34% salt."),
    ("How do noise-cancelling headphones work?",
     "Microphones pick up the outside noise, and the headphones play a sound wave that is its "
     "mirror image. The two waves cancel each other, so steady low-frequency noise is much quieter."),
    ("What is the greenhouse effect?",
     "Gases such as carbon dioxide and water vapour let sunlight through but absorb the infrared "
     "heat the Earth radiates. They send part of it back down, keeping the surface warmer."),
    ("Why do onions make you cry?",
     "Cutting an onion breaks its cells, and enzymes turn sulfur compounds into a gas called "
     "syn-propanethial-S-oxide. It irritates the eyes, which make tears to wash it away."),
    ("What is the function of red blood cells?",
     "Red blood cells carry oxygen from the lungs to the body's tissues, bound to the protein "
     "haemoglobin, and carry part of the carbon dioxide back to the lungs."),
    ("Why do we see lightning before we hear thunder?",
     "Light travels at about 300,000 km per second, while sound travels at only about 343 metres "
     "per second in air. The flash reaches us almost at once and the thunder arrives later."),
]


def main():
    args = sys.argv[1:]
    seed = 7
    if "--seed" in args:
        i = args.index("--seed")
        seed = int(args[i + 1])
        del args[i:i + 2]
    out = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "admission_pairs.jsonl")
    rng = random.Random(seed)
    pairs = (math_pairs(rng) + format_pairs() + [("code", p, a) for p, a in CODE]
             + [("general", p, a) for p, a in GENERAL])
    # Interleave domains so that --limit N keeps every domain.
    by_domain = {}
    for d, p, a in pairs:
        by_domain.setdefault(d, []).append((d, p, a))
    ordered = []
    for i in range(max(len(v) for v in by_domain.values())):
        for d in sorted(by_domain):
            if i < len(by_domain[d]):
                ordered.append(by_domain[d][i])
    with open(out, "w") as f:
        for d, p, a in ordered:
            f.write(json.dumps({"domain": d, "prompt": p, "answer": a}) + "\n")
    print(f"wrote {len(ordered)} pairs over {len(by_domain)} domains to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
