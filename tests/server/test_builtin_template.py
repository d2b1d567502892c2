"""--chat-template NAME with one of llama.cpp's built-in names: the server renders with it."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.server.conftest import start_server, stop_server

LLAMA3_USER = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
LLAMA3_ASSISTANT = "<|start_header_id|>assistant<|end_header_id|>\n\n"


def test_llama3_builtin_renders_prompts_and_answers(model_path: str, tmp_path: Path) -> None:
    srv = start_server(["-m", model_path, "-np", "1", "-c", "512", "-t", "2", "--chat-template", "llama3"], tmp_path)
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            messages = [{"role": "user", "content": "Hi"}]
            prompt = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
            assert prompt == LLAMA3_USER + LLAMA3_ASSISTANT
            assert http.get("/props").json()["chat_template"] == "llama3"  # the name, as llama-server shows it

            r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["choices"][0]["message"]["role"] == "assistant"
            assert isinstance(body["choices"][0]["message"]["content"], str)
            # The prompt the model saw is the llama3 rendering, not SmolLM2's ChatML.
            tokenized = http.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
            assert body["usage"]["prompt_tokens"] == len(tokenized)

            tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
            refused = http.post("/v1/chat/completions", json={"messages": messages, "tools": [tool], "max_tokens": 4})
            assert refused.status_code == 400
            assert "Jinja" in refused.json()["error"]["message"]
    finally:
        stop_server(srv)
