#!/usr/bin/env python3
"""Time to first token of a conversation's second turn, by KV-cache situation.

The conversation: a system prompt, a first user turn carrying a ~2,000-token
document, a fixed assistant answer and a short second question. Measured per
server (each started alone, one slot, streaming chat completions, temperature
0), the second turn's TTFT:

* ``no_cache``: ``cache_prompt: false`` (everything is recomputed);
* ``cached``: right after the first turn ran on the same slot;
* ``after_restart``: the server was stopped after the first turn and started
  again. Ours runs with ``--slot-save-path D --cache-persist``; the C++ server
  has no such flag, so it is measured cold and also with the slot saved by
  hand before the stop and restored by hand after the start
  (``after_restart_manual``; the restore time is reported beside it).

Every figure is the median of ``--repeats`` runs. Example::

    python benchmarks/kv_bench.py \\
        --name ours --server "{python} -m llamaserve -m {model} --port {port} -np 1 -c 4096 -t 2" --persist ours \\
        --name cpp --server "benchmarks/.cpp-server/llama-server -m {model} --port {port} -np 1 -c 4096 -t 2 -nr"
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from serve_bench import DEFAULT_RESULTS_DIR, ServerProcess, default_model, free_port, long_text

SYSTEM = "You are a careful assistant. Answer from the document only."
WARM_UP = [{"role": "user", "content": "Say hello."}]
FIRST_ANSWER = "The document is a long list of loosely connected sentences about everyday things."


def conversation(doc_words: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    first = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Document:\n" + long_text(doc_words) + "\n\nWhat is this document?"},
    ]
    second = first + [
        {"role": "assistant", "content": FIRST_ANSWER},
        {"role": "user", "content": "Name one word that appears in it."},
    ]
    return first, second


def ttft(url: str, messages: list[dict[str, str]], cache_prompt: bool = True) -> tuple[float, int]:
    """Seconds to the first generated text, and the prompt tokens the server reused."""
    body = {
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "cache_prompt": cache_prompt,
        "timings_per_token": True,
    }
    t0 = time.perf_counter()
    first: float | None = None
    cache_n = -1
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if first is None and (delta.get("content") or delta.get("reasoning_content")):
                first = time.perf_counter() - t0
            if "timings" in chunk:
                cache_n = int(chunk["timings"].get("cache_n", -1))
    assert first is not None, "no text came back"
    return first, cache_n


class Server:
    def __init__(self, template: str, model: str, extra: list[str], log_dir: Path, name: str) -> None:
        self.port = free_port()
        argv = shlex.split(template.format(python=sys.executable, model=model, port=self.port)) + extra
        self.proc = ServerProcess(argv, log_dir / f"kv_bench-{name}-{self.port}.log")
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.proc.start()
        deadline = time.time() + 180
        while time.time() < deadline:
            if not self.proc.alive():
                raise RuntimeError(f"server exited: {self.proc.exit_status()} (log {self.proc.log_path})")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not become healthy")

    def __exit__(self, *exc: object) -> None:
        self.proc.stop(timeout=60)


def bench(
    name: str, template: str, model: str, persist: bool, repeats: int, doc_words: int, log_dir: Path
) -> dict[str, Any]:
    first, second = conversation(doc_words)
    runs: dict[str, list[float]] = {"no_cache": [], "cached": [], "after_restart": []}
    if not persist:
        runs["after_restart_manual"] = []
        runs["restore_ms"] = []
    cache_seen: dict[str, list[int]] = {k: [] for k in runs}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as saves:
            extra = ["--slot-save-path", saves] + (["--cache-persist"] if persist else [])
            with Server(template, model, extra, log_dir, name) as srv:
                ttft(srv.url, WARM_UP)  # weights paged in, buffers allocated
                ttft(srv.url, first)  # the slot now holds the first turn and its answer
                t, n = ttft(srv.url, second)
                runs["cached"].append(t)
                cache_seen["cached"].append(n)
                t, n = ttft(srv.url, second, cache_prompt=False)
                runs["no_cache"].append(t)
                cache_seen["no_cache"].append(n)
                ttft(srv.url, first)  # as before the cached turn, for the restart
                if not persist:
                    httpx.post(f"{srv.url}/slots/0?action=save", json={"filename": "turn1.bin"}, timeout=120)
            with Server(template, model, extra, log_dir, name) as srv:
                t, n = ttft(srv.url, second)
                runs["after_restart"].append(t)
                cache_seen["after_restart"].append(n)
            if not persist:
                with Server(template, model, extra, log_dir, name) as srv:
                    r = httpx.post(f"{srv.url}/slots/0?action=restore", json={"filename": "turn1.bin"}, timeout=120)
                    runs["restore_ms"].append(float(r.json()["timings"]["restore_ms"]) / 1000.0)
                    t, n = ttft(srv.url, second)
                    runs["after_restart_manual"].append(t)
                    cache_seen["after_restart_manual"].append(n)
    return {
        "name": name,
        "ttft_s": {k: statistics.median(v) for k, v in runs.items()},
        "runs": runs,
        "cache_n": cache_seen,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", action="append", required=True)
    ap.add_argument("--server", action="append", required=True)
    ap.add_argument(
        "--persist",
        action="append",
        default=[],
        help="the --name of a server that supports --cache-persist (others get the manual path)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--doc-words", type=int, default=1750, help="about 2,000 tokens with SmolLM2's tokenizer")
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    model = args.model or str(default_model())
    persist_flags = [name in args.persist for name in args.name]
    DEFAULT_RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    results = [
        bench(n, s, model, p, args.repeats, args.doc_words, DEFAULT_RESULTS_DIR)
        for n, s, p in zip(args.name, args.server, persist_flags)
    ]
    keys = ["no_cache", "cached", "after_restart", "after_restart_manual", "restore_ms"]
    print("| server | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for res in results:
        cells = [f"{res['ttft_s'][k] * 1000:.0f} ms" if k in res["ttft_s"] else "—" for k in keys]
        print(f"| {res['name']} | " + " | ".join(cells) + " |")
    for res in results:
        print(f"{res['name']} cache_n per run: {json.dumps(res['cache_n'])}")
    out = DEFAULT_RESULTS_DIR / f"kv_bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
