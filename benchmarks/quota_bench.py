"""What --api-keys-config costs: aggregate throughput at 64 clients, quotas and usage on vs off.

Two servers on the same model are started once: one plain, one with a keys file of 64 named
keys (one per client) whose limits are generous enough never to refuse but are all checked:
requests and tokens per minute, requests in flight, a max_tokens cap (so every body is read
and checked) and the usage written to SQLite. They take turns (A B, B A, ...: a slow spell
of the shared machine falls on both); in a turn 64 clients each send `--requests` streamed
chat completions of `--tokens` tokens (`ignore_eos`), one after another. Reported per server:
the median aggregate rate (completion tokens over the turn's wall time) and the cost,
1 - on/off (goal <= 2%), with a bootstrap 95% interval of the per-turn costs' median.

On 2 cores the turns' rates swing by more than the goal, so a second figure bounds the cost
from the side that is steadier: each server's own CPU time per completion token (user + system
of all its threads, from /proc), on against off. The server is CPU-bound here, so what quotas
add to its CPU per token bounds what they can take from its throughput.

    .venv/bin/python benchmarks/quota_bench.py --turns 6 --clients 64 --tokens 32 --requests 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_bench import default_model
from serve_bench import ServerProcess, free_port, wait_healthy

PROMPT = "Write a long story about a lighthouse keeper and the sea."


def keys_file(path: Path, clients: int) -> list[str]:
    keys = [f"sk-bench-{i:03d}" for i in range(clients)]
    entries = [
        f'[[keys]]\nname = "client-{i:03d}"\nkey = "{key}"\nrequests_per_minute = 100000\n'
        f"tokens_per_minute = 1000000000\nmax_concurrent = 64\nmax_tokens = 4096\n"
        for i, key in enumerate(keys)
    ]
    path.write_text("\n".join(entries))
    return keys


async def client_loop(client: httpx.AsyncClient, url: str, key: str | None, args: argparse.Namespace) -> int:
    """Completion tokens this client received over its requests."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": args.tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    tokens = 0
    for _ in range(args.requests):
        async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as res:
            res.raise_for_status()
            async for line in res.aiter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if any(c.get("delta", {}).get("content") for c in event.get("choices", ())):
                        tokens += 1
    return tokens


CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK  # utime, stime


async def turn(
    client: httpx.AsyncClient, url: str, keys: list[str | None], args: argparse.Namespace, pid: int | None = None
) -> tuple[float, float]:
    """(completion tokens per second, the server's CPU µs per completion token)."""
    cpu0 = process_cpu_s(pid) if pid else 0.0
    start = time.perf_counter()
    counts = await asyncio.gather(*(client_loop(client, url, key, args) for key in keys))
    seconds = time.perf_counter() - start
    cpu = (process_cpu_s(pid) - cpu0) if pid else 0.0
    return sum(counts) / seconds, cpu / max(sum(counts), 1) * 1e6


def median_interval(values: list[float], rounds: int = 2000) -> tuple[float, float]:
    """A bootstrap 95% interval of the median of `values`."""
    rng = random.Random(1)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


async def run(args: argparse.Namespace) -> None:
    model = args.model or default_model()
    tmp = Path(tempfile.mkdtemp(prefix="quota-bench-"))
    keys = keys_file(tmp / "keys.toml", args.clients)
    common = [sys.executable, "-m", "llamaserve", "-m", model, "-t", str(args.threads)]
    common += ["-np", str(args.clients), "-c", str(args.clients * 256), "--responses-db", str(tmp / "r.sqlite3")]
    servers: dict[str, tuple[ServerProcess, str, list[str | None]]] = {}
    on_flags = ["--api-keys-config", str(tmp / "keys.toml"), "--usage-db", str(tmp / "usage.sqlite3")]
    for name, extra, turn_keys in (("off", [], [None] * args.clients), ("on", on_flags, list(keys))):
        port = free_port()
        proc = ServerProcess([*common, "--port", str(port), *extra], tmp / f"{name}.log")
        proc.start()
        servers[name] = (proc, f"http://127.0.0.1:{port}", turn_keys)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu_per_token: dict[str, list[float]] = {"off": [], "on": []}
    try:
        limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients * 2)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            for proc, url, _ in servers.values():
                await wait_healthy(client, url, 180, proc.alive)
            for _, url, turn_keys in servers.values():  # warm-up: connections, compute buffers
                await turn(client, url, turn_keys, argparse.Namespace(tokens=4, requests=1))
            for i in range(args.turns):
                order = ("off", "on") if i % 2 == 0 else ("on", "off")
                for name in order:
                    proc, url, turn_keys = servers[name]
                    assert proc.proc is not None
                    rate, cpu_us = await turn(client, url, turn_keys, args, proc.proc.pid)
                    rates[name].append(rate)
                    cpu_per_token[name].append(cpu_us)
                    print(f"turn {i + 1} {name:>3}: {rate:7.1f} tok/s, server CPU {cpu_us:7.1f} µs/token", flush=True)
            _, url, _ = servers["on"]
            usage = (await client.get(url + "/usage", headers={"Authorization": f"Bearer {keys[0]}"})).json()
    finally:
        for proc, _, _ in servers.values():
            proc.stop(20)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"median off {off:.1f} tok/s, on {on:.1f} tok/s: cost {100 * (1 - on / off):+.1f}% (goal <= 2%)")
    pairs = [1 - b / a for a, b in zip(rates["off"], rates["on"], strict=True)]
    low, high = median_interval(pairs)
    print(
        f"per-turn cost: median {100 * statistics.median(pairs):+.1f}% (95% interval {100 * low:+.1f}..{100 * high:+.1f}%),"
        f" spread {100 * min(pairs):+.1f}..{100 * max(pairs):+.1f}%"
    )
    cpu_off, cpu_on = statistics.median(cpu_per_token["off"]), statistics.median(cpu_per_token["on"])
    cpu_pairs = [b / a - 1 for a, b in zip(cpu_per_token["off"], cpu_per_token["on"], strict=True)]
    low, high = median_interval(cpu_pairs)
    print(
        f"server CPU per token: off {cpu_off:.0f} µs, on {cpu_on:.0f} µs; per-turn extra: median"
        f" {100 * statistics.median(cpu_pairs):+.1f}% (95% interval {100 * low:+.1f}..{100 * high:+.1f}%)"
    )
    print(f"usage of client-000 after the run: {usage['data']}")


def micro(n: int) -> None:
    """The middleware alone, in process: µs per POST through every check and the usage write."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from llamaserve.api.quota import QuotaMiddleware
    from llamaserve.quota.policy import load_keys_config
    from llamaserve.quota.usage import UsageLedger, UsageStore

    tmp = Path(tempfile.mkdtemp(prefix="quota-micro-"))
    keys = keys_file(tmp / "keys.toml", 64)
    body = json.dumps({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 32}).encode()

    async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        await receive()  # type: ignore[operator]
        scope["state"]["tokens"] = (30, 20, 32)
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"{}"})  # type: ignore[operator]

    async def go() -> float:
        ledger = UsageLedger(UsageStore(tmp / "usage.sqlite3"))
        mw = QuotaMiddleware(
            app, load_keys_config(str(tmp / "keys.toml")), ledger, model="m", check_models=False, body_limit=1 << 20
        )  # type: ignore[arg-type]

        async def one(i: int) -> None:
            scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "state": {},
                     "headers": [(b"authorization", f"Bearer {keys[i % 64]}".encode())]}  # fmt: skip

            async def receive() -> dict:  # type: ignore[type-arg]
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message: dict) -> None:  # type: ignore[type-arg]
                pass

            await mw(scope, receive, send)

        start = time.perf_counter()
        for base in range(0, n, 64):  # 64 at a time, as the clients
            await asyncio.gather(*(one(base + i) for i in range(64)))
        return (time.perf_counter() - start) / n * 1e6

    print(f"middleware alone: {asyncio.run(go()):.1f} µs per request (checks, body read, usage to SQLite)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--micro", type=int, default=0, help="only time the middleware alone over N requests")
    args = parser.parse_args()
    if args.micro:
        micro(args.micro)
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
