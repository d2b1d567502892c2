"""KV cache types side by side: KV memory and decode speed at a long context.

    .venv/bin/python benchmarks/kv_types.py [--ctx 4096] [--types f16,q8_0] [--repeats 3]

For each `-ctk/-ctv` pair it starts our server with one slot, reads the KV buffer size that
llama.cpp logs at start, fills the context to about 85% with a prompt, then decodes a fixed
number of tokens and takes the decode rate the server reports (`timings.predicted_per_second`),
best of `--repeats`. The same prompt and seed go to every type, so only the cache type differs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from llamaserve.config import embedded_default_model  # noqa: E402

KV_LINE = re.compile(r"KV buffer size\s*=\s*([0-9.]+) MiB")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CPP_SERVER = REPO / "benchmarks" / ".cpp-server" / "llama-server"


def measure(model: str, ctx: int, kv_type: str, repeats: int, n_predict: int, cpp: bool) -> dict[str, float | str]:
    port = free_port()
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    args = ["-m", model, "-c", str(ctx), "-np", "1", "-t", "2", "-ctk", kv_type, "-ctv", kv_type]
    program = [str(CPP_SERVER), "-tb", "2"] if cpp else [sys.executable, "-m", "llamaserve", "-lv", "4"]
    cmd = [*program, "--port", str(port), *args]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        sizes = [float(m) for m in KV_LINE.findall(log.read_text())]
        words = int(ctx * 0.85) - n_predict
        prompt = " ".join(f"item{i % 97}" for i in range(words // 3))
        tokens = httpx.post(f"{url}/tokenize", json={"content": prompt}, timeout=60).json()["tokens"]
        body = {
            "prompt": tokens[: int(ctx * 0.85) - n_predict],
            "n_predict": n_predict,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
        }
        rates = []
        for _ in range(repeats):
            timings = httpx.post(f"{url}/completion", json=body, timeout=600).json()["timings"]
            rates.append(float(timings["predicted_per_second"]))
        return {
            "server": "cpp" if cpp else "ours",
            "type": kv_type,
            "kv_mib": sum(sizes),
            "prompt_tokens": float(len(body["prompt"])),
            "decode_tok_s": max(rates),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--types", default="f16,q8_0")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--model", default=embedded_default_model())
    parser.add_argument("--cpp", action="store_true", help="also measure the C++ llama-server (benchmarks/.cpp-server)")
    args = parser.parse_args()
    sides = [False, True] if args.cpp else [False]
    types = args.types.split(",")
    rows = [measure(args.model, args.ctx, t, args.repeats, args.n_predict, cpp) for cpp in sides for t in types]
    print(json.dumps(rows, indent=2))
    for side in ("ours", "cpp"):
        mine = [r for r in rows if r["server"] == side]
        for row in mine[1:]:
            base = mine[0]
            print(
                f"{side}: {row['type']} vs {base['type']}: KV {row['kv_mib']:.1f} / {base['kv_mib']:.1f} MiB, "
                f"decode {float(row['decode_tok_s']) / float(base['decode_tok_s']):.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
