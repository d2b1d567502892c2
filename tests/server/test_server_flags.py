"""Server-wide flags a user checks from the outside: -r, -sp, --grammar/-j, the reasoning
and chat-parsing flags, --no-prefill-assistant, --kv-unified-per-slot, adaptive-p, -nocb,
--embd-normalize. Four servers in all, each carrying several flags."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import start_server, stop_server

# Reads enable_thinking and reasoning_effort, so the rendered prompt shows what the flags set.
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "thinking={{ enable_thinking }} effort={{ reasoning_effort }}\n{% endif %}"
)
PREFILL = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"}]
IM_END = 2  # SmolLM2's end-of-turn token


def _template(tmp: Path) -> str:
    path = tmp / "tpl.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    return str(path)


def _post(url: str, path: str, body: dict[str, Any]) -> Any:
    r = httpx.post(f"{url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_special_slot_cap_adaptive_p_no_cont_batching_and_pure_content(tmp_path: Path) -> None:
    srv = start_server(
        [
            "-t", "2", "-np", "2", "--kv-unified-per-slot", "256", "-sp", "-r", "\\n",
            "--samplers", "top_k;adaptive_p", "--adaptive-target", "0.5",
            "--chat-template-file", _template(tmp_path), "--reasoning", "off",
            "--skip-chat-parsing", "--no-prefill-assistant", "-nocb", "--ctx-checkpoints", "4",
            "-a", "tinyllama-2,fim,code,fim",
        ],
        tmp_path,
    )  # fmt: skip
    try:
        url = srv.url
        props = httpx.get(f"{url}/props").json()["default_generation_settings"]
        assert props["n_ctx"] == 256
        assert props["params"]["samplers"] == ["top_k", "adaptive_p"] and props["params"]["adaptive_target"] == 0.5
        assert [s["n_ctx"] for s in httpx.get(f"{url}/slots").json()] == [256, 256]
        assert "no context checkpoints" in srv.log()
        # -a: every alias listed once; the alphabetically first names the model, as in llama-server.
        model = httpx.get(f"{url}/v1/models").json()["data"][0]
        assert model["id"] == "code" and model["aliases"] == ["code", "fim", "tinyllama-2"]

        # -sp: the end-of-turn token is written into the text and the probabilities.
        done = _post(
            url, "/completion", {"prompt": "Hello", "n_predict": 8, "logit_bias": [[IM_END, 100]], "n_probs": 1}
        )
        if done["stop_type"] == "eos":  # adaptive-p draws near p=0.5, not always the biased token
            assert done["content"].endswith("<|im_end|>")
            assert done["completion_probabilities"][-1]["token"] == "<|im_end|>"
        else:
            assert done["stop_type"] in ("word", "limit")

        # --reasoning off reaches the template; --no-prefill-assistant closes the final assistant turn.
        prompt = _post(url, "/apply-template", {"messages": PREFILL})["prompt"]
        assert prompt.endswith("Once<|im_end|>\n<|im_start|>assistant\nthinking=False effort=\n")

        # --skip-chat-parsing: <think> stays in content even when the request asks for deepseek parsing.
        chat = _post(
            url,
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
                "grammar": 'root ::= "<think>a</think>b"',
                "reasoning_format": "deepseek",
            },
        )
        message = chat["choices"][0]["message"]
        assert message["content"].startswith("<think>a") and "reasoning_content" not in message

        # -nocb: two requests at once still both finish.
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda p: _post(url, "/completion", {"prompt": p, "n_predict": 6}), ["One", "Two"]))
        assert all(b["tokens_predicted"] >= 1 for b in both)
    finally:
        stop_server(srv)


def test_default_grammar_reverse_prompt_prefill_and_reasoning_flags(tmp_path: Path) -> None:
    srv = start_server(
        [
            "-t", "2", "-np", "1", "-r", "\\n", "--grammar", 'root ::= "yes"',
            "--chat-template-file", _template(tmp_path), "--reasoning", "on", "--reasoning-effort", "high",
        ],
        tmp_path,
    )  # fmt: skip
    try:
        url = srv.url
        plain = _post(url, "/completion", {"prompt": "Hello", "n_predict": 4})
        assert plain["content"] == "yes"
        # The request's grammar wins; -r "\n" then stops the answer at its newline.
        own = _post(url, "/completion", {"prompt": "Hello", "n_predict": 4, "grammar": 'root ::= "a\\nb"'})
        assert (own["content"], own["stop_type"], own["stopping_word"]) == ("a", "word", "\n")
        assert own["generation_settings"]["stop"] == ["\n"]
        named = _post(url, "/completion", {"prompt": "Hello", "n_predict": 4, "stop": ["zzz"]})
        assert named["generation_settings"]["stop"] == ["zzz"]
        chat = _post(
            url,
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "response_format": {"type": "json_object"},
            },
        )
        assert chat["choices"][0]["message"]["content"].startswith("{")
        default = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert default["choices"][0]["message"]["content"] == "yes"

        # Prefill (the default) continues the final assistant message; --reasoning on and
        # --reasoning-effort reach the template, and a request's kwargs override them.
        prompt = _post(url, "/apply-template", {"messages": PREFILL})["prompt"]
        assert prompt.endswith("<|im_start|>assistant\nthinking=True effort=high\nOnce")
        asked = _post(
            url,
            "/apply-template",
            {"messages": PREFILL[:1], "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"}},
        )["prompt"]
        assert asked.endswith("thinking=False effort=low\n")
    finally:
        stop_server(srv)


def test_json_schema_flag_is_the_default_grammar(tmp_path: Path) -> None:
    schema = '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}'
    srv = start_server(["-t", "2", "-np", "1", "-j", schema], tmp_path)
    try:
        out = _post(srv.url, "/completion", {"prompt": "Hello", "n_predict": 8})
        assert out["content"].startswith("{") and '"a"' in out["content"]
        own = _post(srv.url, "/completion", {"prompt": "Hello", "n_predict": 4, "json_schema": {"type": "array"}})
        assert own["content"].startswith("[")
    finally:
        stop_server(srv)


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def test_embd_normalize_is_the_servers_default(tmp_path: Path) -> None:
    srv = start_server(["-t", "2", "-np", "1", "--embeddings", "--pooling", "mean", "--embd-normalize", "-1"], tmp_path)
    try:
        raw = _post(srv.url, "/embedding", {"content": "hello"})[0]["embedding"][0]
        assert abs(_norm(raw) - 1.0) > 0.1  # -1: no normalisation
        unit = _post(srv.url, "/embedding", {"content": "hello", "embd_normalize": 2})[0]["embedding"][0]
        assert _norm(unit) == pytest.approx(1.0, abs=1e-4)  # the request's own value wins
        oai = _post(srv.url, "/v1/embeddings", {"input": "hello"})["data"][0]["embedding"]
        assert _norm(oai) == pytest.approx(_norm(raw), rel=1e-4)  # the OpenAI route follows it too
    finally:
        stop_server(srv)
