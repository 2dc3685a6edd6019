#!/usr/bin/env python3
"""Prints the benchmark's sentences, one a line, deterministically.

Agent-card-like texts of 4 to ~60 words (about 6 to 80 tokens), the range a
Starling node embeds most; a few long ones exercise the 256-token limit.
"""

import random

SUBJECTS = ["An agent", "This node", "A research assistant", "The translator", "A planner",
            "The code reviewer", "A data analyst", "The scheduler", "A helpful bot", "The summariser"]
VERBS = ["summarises", "translates", "reviews", "plans", "answers questions about", "indexes",
         "classifies", "extracts tables from", "writes tests for", "monitors"]
OBJECTS = ["research papers", "Rust code", "customer emails", "meeting notes", "legal contracts",
           "news articles", "sensor readings", "SQL queries", "travel itineraries", "bug reports"]
TAILS = ["in English and French", "with citations", "every morning", "on request",
         "for small teams", "using local models only", "without sending data off the LAN",
         "and flags anything unusual", "in under a minute", "with a short confidence score"]
FILLER = ("It cooperates with other agents on the swarm, keeps a contact book of past "
          "collaborators, and reports progress to the group chat when a task is assigned. ")


def main() -> None:
    rng = random.Random(20240611)
    for i in range(256):
        words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            words.append(rng.choice(TAILS))
        text = " ".join(words) + "."
        if i % 4 == 0:
            text += " " + FILLER * rng.choice([1, 1, 2])
        if i % 64 == 0:
            text += FILLER * 6
        print(text.strip())


if __name__ == "__main__":
    main()
