"""Bounded load on a running `starling serve` (loopback only).

For each scenario, C concurrent clients each send R requests back to back. Prints
requests/s, p50/p99 latency, rejected (429) requests and fairness: the slowest client's
mean latency over the fastest one's (1.0 = every client served alike).

Usage: load.py BASE_URL [--json]   (BASE_URL like http://127.0.0.1:7431/v1)
"""

import asyncio
import json
import statistics
import sys
import time

import httpx

SCENARIOS = [
    # (name, path, body, clients, requests per client)
    ("embeddings c=1", "/embeddings", {"model": "all-minilm-l6-v2", "input": "a short sentence about seeds"}, 1, 40),
    ("embeddings c=8", "/embeddings", {"model": "all-minilm-l6-v2", "input": "a short sentence about seeds"}, 8, 20),
    ("embeddings c=32", "/embeddings", {"model": "all-minilm-l6-v2", "input": "a short sentence about seeds"}, 32, 8),
    ("chat 16 tok c=1", "/chat/completions", None, 1, 8),
    ("chat 16 tok c=4", "/chat/completions", None, 4, 4),
    ("chat 16 tok c=8", "/chat/completions", None, 8, 3),
]


def chat_body(i):
    return {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": f"Name one colour. ({i})"}],
        "max_tokens": 16,
        "temperature": 0,
    }


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def client(http, base, path, body, n, cid, lat, rejected, per_client):
    mine = []
    for i in range(n):
        b = body if body is not None else chat_body(cid * 1000 + i)
        t = time.perf_counter()
        r = await http.post(base + path, json=b)
        dt = time.perf_counter() - t
        if r.status_code == 429:
            rejected.append(dt)
            await asyncio.sleep(0.05)
            continue
        r.raise_for_status()
        lat.append(dt)
        mine.append(dt)
    per_client.append(statistics.mean(mine) if mine else float("nan"))


async def scenario(base, name, path, body, clients, per):
    lat, rejected, per_client = [], [], []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        # Warm-up (model caches, connection).
        r = await http.post(base + path, json=body if body is not None else chat_body(0))
        r.raise_for_status()
        t = time.perf_counter()
        await asyncio.gather(
            *(client(http, base, path, body, per, c, lat, rejected, per_client) for c in range(clients))
        )
        wall = time.perf_counter() - t
    served = [x for x in per_client if x == x]
    return {
        "scenario": name,
        "clients": clients,
        "requests": len(lat),
        "rejected_429": len(rejected),
        "rps": len(lat) / wall,
        "p50_ms": 1000 * pct(lat, 0.5),
        "p99_ms": 1000 * pct(lat, 0.99),
        "fairness_max_over_min": max(served) / min(served) if served else None,
    }


async def main():
    base = sys.argv[1].rstrip("/")
    as_json = "--json" in sys.argv
    rows = []
    for name, path, body, clients, per in SCENARIOS:
        rows.append(await scenario(base, name, path, body, clients, per))
        if not as_json:
            r = rows[-1]
            print(
                f"{r['scenario']:<18} {r['requests']:>4} ok {r['rejected_429']:>3} x429 "
                f"{r['rps']:8.1f} req/s  p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms  "
                f"fairness {r['fairness_max_over_min']:.2f}"
            )
    if as_json:
        print(json.dumps(rows, indent=2))


asyncio.run(main())
