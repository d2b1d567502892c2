"""--chat-template NAME with one of llama.cpp's built-in names: the server renders with it."""

from __future__ import annotations

import subprocess
import sys
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


SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_no_jinja_renders_with_llama_cpp_built_in_format(model_path: str, tmp_path: Path) -> None:
    """--no-jinja: llama.cpp picks the format from SmolLM2's template (ChatML) and renders it itself:
    no default system prompt, which SmolLM2's Jinja template adds, and tools need --jinja."""
    messages = [{"role": "user", "content": "Hi"}]
    srv = start_server(["-m", model_path, "-np", "1", "-c", "512", "-t", "2", "--no-jinja"], tmp_path)
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            prompt = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
            assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
            tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
            refused = http.post("/v1/chat/completions", json={"messages": messages, "tools": [tool], "max_tokens": 4})
            assert refused.status_code == 400 and "--jinja" in refused.json()["error"]["message"]
    finally:
        stop_server(srv)
    # A template llama.cpp has no format for: refused at start, naming the flag.
    template = tmp_path / "unknown.jinja"
    template.write_text("{% for m in messages %}[[{{ m.role }}]] {{ m.content }}\n{% endfor %}")
    failed = subprocess.run(
        [sys.executable, "-m", "llamaserve", "-m", model_path, "--no-jinja", "--chat-template-file", str(template)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 1 and "--no-jinja: none of llama.cpp's built-in chat templates" in failed.stderr


def test_the_jinja_template_of_smollm2_differs_from_the_built_in(base_url: str) -> None:
    """The control for the test above: the same messages under the default --jinja."""
    prompt = httpx.post(f"{base_url}/apply-template", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert SMOL_SYSTEM in prompt["prompt"]
