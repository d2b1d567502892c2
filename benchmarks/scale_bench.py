"""Scale-out: aggregate decode throughput of 1 and 2 replicas, and the prompt-cache hit rate of routing.

Throughput: each replica is our server with one thread pinned to a core of its own
(`taskset -c 0`, `taskset -c 1`), behind one `--upstreams` front (not pinned). The same
load runs against one replica and against two: `--clients` concurrent streamed
completions of `--tokens` tokens each (ignore_eos), `--rounds` each; aggregate tokens/s is
all generated tokens over the wall time. Goal: two replicas >= 1.8x one.

Hit rate: a multi-turn agent workload (`--sessions` conversations, each with its own long
system prompt of tool descriptions, `--turns` turns of growing history, interleaved) sent
once through the front (prefix-aware routing) and once to a random replica per request
(random routing). The hit rate is the share of prompt tokens answered from the replicas'
prompt caches (`timings.cache_n` over `cache_n + prompt_n`), over the follow-up turns (a
first turn is a cold miss under any routing) and over all turns. Goal: >= 90% with routing.

It also times the two ways of indexing a prompt: one `/tokenize` round trip against
hashing its text blocks (what the front does).

    flock -x -w 1200 /tmp/llamaserve-heavy.lock .venv/bin/python benchmarks/scale_bench.py
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llamaserve.config import embedded_default_model  # noqa: E402
from llamaserve.scale.prefix_index import block_hashes, prompt_text  # noqa: E402

TOOLS = [
    "search_files(pattern, path): find files whose names match a glob pattern",
    "read_file(path, start, end): read lines of a text file",
    "write_file(path, text): replace a file's contents",
    "run_tests(selection): run the test suite or a part of it and report failures",
    "git_diff(): show the uncommitted changes",
    "http_get(url): fetch a web page as text",
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(cmd: list[str], log: Path, health: str) -> Iterator[str]:
    url = health.rsplit("/", 1)[0]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 180
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{cmd[:4]} exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(health, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"not ready: {log}")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def replica_cmd(model: str, core: int, port: int, slots: int) -> list[str]:
    return ["taskset", "-c", str(core), sys.executable, "-m", "llamaserve", "-m", model, "-t", "1", "-tb", "1"] + [
        "-np",
        str(slots),
        "-c",
        str(2048 * slots),
        "--port",
        str(port),
        "--temp",
        "0",
    ]


def front_cmd(urls: list[str], port: int) -> list[str]:
    return [sys.executable, "-m", "llamaserve", "--upstreams", ",".join(urls), "--port", str(port)]


def stream_tokens(url: str, prompt: str, tokens: int) -> int:
    body = {"prompt": prompt, "n_predict": tokens, "ignore_eos": True, "stream": True, "cache_prompt": True}
    n = 0
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=300) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: "):
                chunk = json.loads(line[6:])
                if chunk.get("content"):
                    n += 1
    return n


def throughput(front: str, clients: int, tokens: int, rounds: int) -> float:
    """Aggregate generated tokens per second with `clients` concurrent streams."""
    total = 0
    lock = threading.Lock()

    def client(i: int) -> None:
        nonlocal total
        for r in range(rounds):
            n = stream_tokens(front, f"Story {i}-{r}: once upon a time", tokens)
            with lock:
                total += n

    stream_tokens(front, "warm up", 8)
    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return total / (time.perf_counter() - start)


def agent_system(session: int, tag: str) -> str:
    tools = "\n".join(f"- {t} (variant {session})" for t in TOOLS)
    return f"[{tag}] You are coding agent number {session}. You may call these tools:\n{tools}\n" * 3


def hit_rate(urls: list[str], front: str | None, sessions: int, turns: int, tag: str) -> tuple[float, float]:
    """(follow-up turns' hit rate, all turns' hit rate); `front` None means a random replica per request."""
    rng = random.Random(7)
    history = {s: [{"role": "system", "content": agent_system(s, tag)}] for s in range(sessions)}
    follow = [0, 0]
    overall = [0, 0]
    for turn in range(turns):
        for s in range(sessions):
            history[s].append({"role": "user", "content": f"Step {turn + 1}: look at module {s}.{turn} and report."})
            target = front if front is not None else rng.choice(urls)
            body = {"messages": history[s], "max_tokens": 8, "temperature": 0}
            answer = httpx.post(f"{target}/v1/chat/completions", json=body, timeout=300).json()
            history[s].append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
            cached, fresh = answer["timings"]["cache_n"], answer["timings"]["prompt_n"]
            overall[0] += cached
            overall[1] += cached + fresh
            if turn > 0:
                follow[0] += cached
                follow[1] += cached + fresh
    return follow[0] / max(1, follow[1]), overall[0] / max(1, overall[1])


def index_costs(url: str) -> tuple[float, float]:
    """Median ms of one /tokenize round trip and of hashing the same prompt's text blocks."""
    body = {"messages": [{"role": "system", "content": agent_system(0, "cost")}, {"role": "user", "content": "Go."}]}
    text = prompt_text(body)
    tok, hashing = [], []
    for _ in range(20):
        t = time.perf_counter()
        httpx.post(f"{url}/tokenize", json={"content": text}, timeout=30).raise_for_status()
        tok.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        block_hashes(prompt_text(body))
        hashing.append((time.perf_counter() - t) * 1000)
    return statistics.median(tok), statistics.median(hashing)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=embedded_default_model())
    parser.add_argument("--clients", type=int, default=4, help="concurrent streams per replica")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    slots = args.clients
    ports = [_port(), _port(), _port(), _port()]
    a_cmd = replica_cmd(args.model, 0, ports[0], slots)
    b_cmd = replica_cmd(args.model, 1, ports[1], slots)
    a_url, b_url = (f"http://127.0.0.1:{p}" for p in ports[:2])
    with process(a_cmd, tmp / "a.log", f"{a_url}/health"):
        with process(front_cmd([a_url], ports[2]), tmp / "f1.log", f"http://127.0.0.1:{ports[2]}/health") as front:
            one = throughput(front, args.clients, args.tokens, args.rounds)
        with (
            process(b_cmd, tmp / "b.log", f"{b_url}/health"),
            process(
                front_cmd([a_url, b_url], ports[3]), tmp / "f2.log", f"http://127.0.0.1:{ports[3]}/health"
            ) as front,
        ):
            two = throughput(front, 2 * args.clients, args.tokens, args.rounds)
            tokenize_ms, hash_ms = index_costs(a_url)
            routed = hit_rate([a_url, b_url], front, args.sessions, args.turns, "routed")
            randomly = hit_rate([a_url, b_url], None, args.sessions, args.turns, "random")
    print(f"throughput: 1 replica {one:.1f} tok/s, 2 replicas {two:.1f} tok/s, ratio {two / one:.2f} (goal >= 1.8)")
    print(
        f"prompt-cache hit rate, follow-up turns: prefix-aware {routed[0]:.1%}, random {randomly[0]:.1%} (goal >= 90%)"
    )
    print(f"prompt-cache hit rate, all turns: prefix-aware {routed[1]:.1%}, random {randomly[1]:.1%}")
    print(f"indexing a prompt: /tokenize {tokenize_ms:.2f} ms, text-block hashes {hash_ms:.3f} ms (median of 20)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
