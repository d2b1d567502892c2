"""Image encoding cost, and how the other slots fare while images are encoded.

A gemma3-type projector of random weights with SigLIP-base's size (ViT 768 wide, 12 layers,
224 px images in 14 px patches → 256 patches → 64 tokens after pooling) is built with
tests/models/mmproj.py, so the encoder costs what a small real one does (the weights mean
nothing). Two figures:

1. encode: libmtmd's encoder on one image, in this process (median of several images);
2. the server (SmolLM2 + that projector, -np 2): one slot streams a long completion; after a
   quiet baseline, image requests (a new image each, so each is encoded) are sent one after
   another. Reported: the stream's tokens/s before and during the image requests, its longest
   gap between two tokens in each phase, and the image requests' latency.

    flock -x -w 1200 /tmp/llamaserve-heavy.lock .venv/bin/python benchmarks/mm_bench.py --port 18620
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from llamaserve.config import embedded_default_model  # noqa: E402
from tests.media_files import png  # noqa: E402
from tests.models.mmproj import vision_projector  # noqa: E402

SIGLIP_BASE = (768, 3072, 12, 12)


def encode_times(model_path: str, proj_path: Path, n: int, threads: int) -> list[float]:
    from llamaserve.llama.model import Model
    from llamaserve.llama.mtmd import CHUNK_TEXT, Projector, ProjectorSettings

    model = Model(model_path)
    proj = Projector(str(proj_path), model, ProjectorSettings(use_gpu=False, n_threads=threads, warmup=True))
    out = []
    try:
        for i in range(n):
            chunks = proj.tokenize(
                f"a {proj.marker} b", [png(300, 200, seed=500 + i)], add_special=True, parse_special=True
            )
            media = next(c for c in chunks if c.kind != CHUNK_TEXT)
            t0 = time.perf_counter()
            proj.encode(media)
            out.append(time.perf_counter() - t0)
            Projector.release(chunks)
    finally:
        proj.close()
        model.close()
    return out


def stream_tokens(url: str, stamps: list[float], stop: threading.Event) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 4000, "ignore_eos": True, "stream": True, "id_slot": 0}
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                stamps.append(time.perf_counter())
            if stop.is_set():
                break


def rate(stamps: list[float], t0: float, t1: float) -> tuple[float, float]:
    inside = [t for t in stamps if t0 <= t <= t1]
    gaps = [b - a for a, b in itertools.pairwise(inside)]
    return (len(inside) - 1) / (inside[-1] - inside[0]) if len(inside) > 1 else 0.0, max(gaps, default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=18620)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = str(embedded_default_model())
    with tempfile.TemporaryDirectory() as tmp:
        proj = vision_projector(Path(tmp) / "mmproj-siglip-base.gguf", image_size=224, patch_size=14, size=SIGLIP_BASE)
        enc = encode_times(model, proj, args.images, args.threads)
        print(f"encode one 224px image (64 tokens): median {statistics.median(enc) * 1000:.0f} ms ({len(enc)} images)")
        url = f"http://127.0.0.1:{args.port}"
        cmd = [sys.executable, "-m", "llamaserve", "-m", model, "-mm", str(proj), "--port", str(args.port)]
        cmd += ["-np", "2", "-c", "4096", "-t", str(args.threads)]
        log = open(Path(tmp) / "server.log", "wb")  # noqa: SIM115 -- the server writes it until stopped
        server = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 120
            while time.time() < deadline:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
            stamps: list[float] = []
            stop = threading.Event()
            streamer = threading.Thread(target=stream_tokens, args=(url, stamps, stop), daemon=True)
            streamer.start()
            while len(stamps) < 5:
                time.sleep(0.05)
            t_base = time.perf_counter()
            time.sleep(5)
            t_img = time.perf_counter()
            latencies = []
            for i in range(args.images):
                image = base64.b64encode(png(300, 200, seed=900 + i)).decode()
                content = [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
                ]
                body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "id_slot": 1}
                t0 = time.perf_counter()
                r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
                latencies.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
            t_end = time.perf_counter()
            stop.set()
            base_rate, base_gap = rate(stamps, t_base, t_img)
            img_rate, img_gap = rate(stamps, t_img, t_end)
            print(
                json.dumps(
                    {
                        "stream_tokens_per_s_baseline": round(base_rate, 1),
                        "stream_tokens_per_s_during_images": round(img_rate, 1),
                        "stream_longest_gap_ms_baseline": round(base_gap * 1000),
                        "stream_longest_gap_ms_during_images": round(img_gap * 1000),
                        "image_request_latency_ms_median": round(statistics.median(latencies) * 1000),
                        "images": args.images,
                    }
                )
            )
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
