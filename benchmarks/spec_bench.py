"""Speculative decoding: single-stream tokens/s on repetitive tasks, llamaserve and the C++
llama-server, same model, same settings, same run.

Three tasks whose answer repeats much of the prompt: rewrite a ~500-token text with small
changes, fill a JSON template, edit a function. Each server is started once per setting
(`none`, n-gram drafting, a draft model), warmed up, then asked each task at temperature 0
(`/v1/chat/completions`, one request at a time). The table gives generation tokens/s (from the
answer's `timings`), the speed-up over `none` of the same server, the draft acceptance rate
(draft_n_accepted / draft_n), and whether the answer's tokens equal the server's own `none`
answer.

    flock -x -w 1200 /tmp/llamaserve-heavy.lock .venv/bin/python benchmarks/spec_bench.py

The draft model is SmolLM2 with six of its 30 blocks (10-15) removed (tests/models/truncated.py), written
to a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import ServerProcess, free_port, wait_healthy  # noqa: E402

from llamaserve.config import embedded_default_model  # noqa: E402
from tests.models.truncated import write_truncated  # noqa: E402

STORY = (
    "The lighthouse on Gannet Point had been dark for eleven years when Mara Quill arrived with a "
    "borrowed van, a box of tools and a letter from the harbour council. The letter said the "
    "lamp could be relit if someone repaired the clockwork that turned the lens, replaced the "
    "cracked panes of the lantern room and kept a log of every night the light burned. Mara had "
    "never repaired a clock larger than a kitchen timer, but she had spent twenty years fixing "
    "fishing boats, and she reasoned that gears were gears. The first week she did nothing but "
    "clean. Gulls had nested in the stairwell, rust had crept over the brass rails, and the "
    "keeper's cottage smelled of damp wool and old paraffin. She scrubbed the floors, burned the "
    "rotten furniture on the beach and slept in the van with the doors open to the sound of the "
    "sea. In the second week she climbed to the lantern room and took the clockwork apart, laying "
    "every piece on a canvas sheet in the order it came out. There were one hundred and forty "
    "parts, and eleven of them were broken. She drew each broken part in a notebook, measured it "
    "with calipers and drove to the town forge, where an old smith named Benedek agreed to cast "
    "new ones if she would bring him fish every Friday for a month. The new parts arrived in the "
    "third week, rough and heavy, and Mara filed them by hand until they fitted. On the last day "
    "of the month she wound the weight to the top of the tower, released the brake and watched "
    "the great lens begin to turn, slowly at first and then steadily, throwing its beam across "
    "the water. That night she wrote the first entry in the new log: light lit at dusk, clear "
    "sky, wind from the west, one fishing boat seen returning to harbour. Benedek walked up the "
    "hill the next morning with a loaf of bread and asked whether she would need any more parts. "
    "Mara told him the clockwork would need cleaning every spring and that she would bring fish "
    "every Friday anyway, because a lighthouse keeper should have at least one friend in town."
)

JSON_TEMPLATE = json.dumps(
    {
        "order_id": "A-1042",
        "customer": {"name": "", "email": "", "phone": ""},
        "shipping": {"street": "", "city": "", "postcode": "", "country": ""},
        "items": [
            {"sku": "TEA-001", "name": "Green tea", "quantity": 0, "unit_price": 0.0},
            {"sku": "MUG-014", "name": "Stoneware mug", "quantity": 0, "unit_price": 0.0},
            {"sku": "SPN-002", "name": "Bamboo spoon", "quantity": 0, "unit_price": 0.0},
        ],
        "notes": "",
    },
    indent=2,
)

CODE = '''def summarize(records):
    """Return the count, total and mean of the amounts in records."""
    count = 0
    total = 0.0
    for record in records:
        if record is None:
            continue
        amount = record.get("amount")
        if amount is None:
            continue
        count += 1
        total += amount
    mean = total / count if count else 0.0
    return {"count": count, "total": total, "mean": mean}


def by_category(records):
    """Group the records by their category field."""
    groups = {}
    for record in records:
        if record is None:
            continue
        category = record.get("category", "other")
        groups.setdefault(category, []).append(record)
    return groups
'''

TASKS: dict[str, str] = {
    "rewrite": "Rewrite the following text exactly as it is, but call the keeper Nora instead of Mara "
    f"and the smith Tamas instead of Benedek. Change nothing else.\n\n{STORY}",
    "json": "Fill in this JSON template for an order by Jane Doe (jane@example.com, 555-0100) shipped to "
    "12 Elm Street, Springfield, 12345, USA: 2 green teas at 4.5, 1 mug at 12.0, 3 spoons at 1.25. "
    f"Answer with the complete JSON only.\n\n{JSON_TEMPLATE}",
    "code edit": "Rename the parameter `records` to `rows` in this code and answer with the whole "
    f"code, unchanged otherwise:\n\n```python\n{CODE}```",
}

SETTINGS: dict[str, list[str]] = {
    "none": [],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "draft-simple": ["--spec-type", "draft-simple", "-md", "{draft}"],
}


async def ask(client: httpx.AsyncClient, url: str, prompt: str, n_predict: int) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": n_predict,
        "return_tokens": True,
    }
    r = await client.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    data = r.json()
    return {"timings": data["timings"], "text": data["choices"][0]["message"]["content"]}


async def run_server(argv: list[str], log: Path, n_predict: int) -> dict[str, dict[str, Any]]:
    proc = ServerProcess(argv, log)
    proc.start()
    try:
        async with httpx.AsyncClient() as client:
            url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
            await wait_healthy(client, url, 300, proc.alive, proc.exit_status)
            await ask(client, url, "Say hello.", 8)  # warm-up
            out = {}
            for name, prompt in TASKS.items():
                t0 = time.perf_counter()
                res = await ask(client, url, prompt, n_predict)
                res["wall_s"] = time.perf_counter() - t0
                out[name] = res
            return out
    finally:
        proc.stop(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=embedded_default_model())
    ap.add_argument("--cpp", default=str(ROOT / "benchmarks/.cpp-server/llama-server"))
    ap.add_argument("--n-predict", type=int, default=256)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--common", default="-np 1 -c 4096 -t 2 --jinja")
    ap.add_argument("--servers", default="ours,cpp", help="which of ours,cpp to run")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="spec-bench-"))
    draft = tmp / "smollm2-24-blocks.gguf"
    write_truncated(args.model, str(draft), keep_layers=[i for i in range(30) if not 10 <= i < 16])
    programs = {"ours": [sys.executable, "-m", "llamaserve"], "cpp": [args.cpp]}
    servers = {name: programs[name] for name in args.servers.split(",")}
    results: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for setting in args.settings.split(","):
        extra = [a.format(draft=draft) for a in SETTINGS[setting]]
        for server, program in servers.items():
            port = free_port()
            argv = [*program, "-m", args.model, "--port", str(port), *shlex.split(args.common), *extra]
            print(f"# {server} {setting}", file=sys.stderr, flush=True)
            results[(server, setting)] = asyncio.run(run_server(argv, tmp / f"{server}-{setting}.log", args.n_predict))
    print("| task | setting | server | tokens | tok/s | speed-up | accepted / drafted | same text as none |")
    print("|---|---|---|---|---|---|---|---|")
    for task in TASKS:
        for setting in args.settings.split(","):
            for server in servers:
                res = results[(server, setting)][task]
                base = results.get((server, "none"), {}).get(task)
                t = res["timings"]
                rate = t["predicted_per_second"]
                speed = f"{rate / base['timings']['predicted_per_second']:.2f}x" if base else "-"
                drafted = t.get("draft_n", 0)
                acc = (
                    f"{t.get('draft_n_accepted', 0)} / {drafted} ({t.get('draft_n_accepted', 0) / drafted:.0%})"
                    if drafted
                    else "-"
                )
                same = "-" if setting == "none" or base is None else ("yes" if res["text"] == base["text"] else "no")
                print(f"| {task} | {setting} | {server} | {t['predicted_n']} | {rate:.1f} | {speed} | {acc} | {same} |")


if __name__ == "__main__":
    main()
