"""llama-server's native endpoints and the behaviour around them."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

# One pooled client: creating a client per call costs ~100 ms (TLS setup), which
# would swamp the timings these tests check.
HTTP = httpx.Client(timeout=60)


def sse_events(response: httpx.Response) -> list[dict]:
    out = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def test_health_models_props(base_url: str, model_path: str) -> None:
    assert HTTP.get(f"{base_url}/health").json() == {"status": "ok"}
    models = HTTP.get(f"{base_url}/v1/models").json()
    assert models["object"] == "list"
    entry = models["data"][0]
    assert entry["object"] == "model" and entry["owned_by"] == "llamacpp"
    assert entry["meta"]["n_vocab"] == 49152 and entry["meta"]["n_ctx"] == 1024
    assert HTTP.get(f"{base_url}/models").json()["data"][0]["id"] == entry["id"]
    props = HTTP.get(f"{base_url}/props").json()
    assert props["total_slots"] == 8
    assert props["default_generation_settings"]["n_ctx"] == 1024
    assert props["model_path"] == model_path
    assert "im_start" in props["chat_template"]
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    assert props["build_info"]


def test_tokenize_detokenize_round_trip(base_url: str) -> None:
    text = "Hello world, ça va? 😀"
    tokens = HTTP.post(f"{base_url}/tokenize", json={"content": text}).json()["tokens"]
    assert all(isinstance(t, int) for t in tokens)
    assert HTTP.post(f"{base_url}/detokenize", json={"tokens": tokens}).json()["content"] == text
    pieces = HTTP.post(f"{base_url}/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens
    # a piece that is not valid UTF-8 on its own comes back as a byte array
    assert "".join(p["piece"] for p in pieces if isinstance(p["piece"], str)).startswith("Hello")
    assert HTTP.post(f"{base_url}/detokenize", json={"tokens": [-3]}).status_code == 400


def test_apply_template_uses_the_models_chatml(base_url: str) -> None:
    r = httpx.post(f"{base_url}/apply-template", json={"messages": [{"role": "user", "content": "Hi"}]})
    prompt = r.json()["prompt"]
    assert "<|im_start|>user\nHi<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_add_generation_prompt_false_leaves_out_the_assistant_header(base_url: str) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    body = {"messages": messages, "add_generation_prompt": False}
    prompt = HTTP.post(f"{base_url}/apply-template", json=body).json()["prompt"]
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n")
    assert "<|im_start|>assistant" not in prompt
    # The chat route honours it too: the prompt the model reads is shorter by that header.
    counts = []
    for flag in (True, False):
        chat = {"messages": messages, "add_generation_prompt": flag, "max_tokens": 1, "temperature": 0}
        counts.append(HTTP.post(f"{base_url}/v1/chat/completions", json=chat).json()["usage"]["prompt_tokens"])
    assert counts[1] < counts[0]


def test_native_completion_shape(base_url: str) -> None:
    r = httpx.post(
        f"{base_url}/completion", json={"prompt": "Once upon a time", "n_predict": 8, "temperature": 0}, timeout=60
    )
    body = r.json()
    for key in (
        "content",
        "tokens",
        "id_slot",
        "stop",
        "model",
        "tokens_predicted",
        "tokens_evaluated",
        "generation_settings",
        "prompt",
        "has_new_line",
        "truncated",
        "stop_type",
        "stopping_word",
        "tokens_cached",
        "timings",
    ):
        assert key in body, key
    assert body["stop"] is True and body["stop_type"] == "limit" and body["tokens_predicted"] == 8
    assert body["timings"]["predicted_n"] == 8
    assert body["generation_settings"]["n_predict"] == 8


def test_native_prompt_forms(base_url: str) -> None:
    tokens = HTTP.post(f"{base_url}/tokenize", json={"content": "The sky is"}).json()["tokens"]
    as_text = httpx.post(
        f"{base_url}/completion", json={"prompt": "The sky is", "n_predict": 6, "temperature": 0}, timeout=60
    ).json()
    as_tokens = httpx.post(
        f"{base_url}/completion", json={"prompt": tokens, "n_predict": 6, "temperature": 0}, timeout=60
    ).json()
    assert as_tokens["content"] == as_text["content"]
    many = httpx.post(
        f"{base_url}/completion",
        json={"prompt": ["The sky is", "Grass is"], "n_predict": 4, "temperature": 0},
        timeout=60,
    ).json()
    assert isinstance(many, list) and len(many) == 2
    assert many[0]["content"] == as_text["content"][: len(many[0]["content"])]
    assert [m["index"] for m in many] == [0, 1]


def test_native_stream(base_url: str) -> None:
    with httpx.stream(
        "POST",
        f"{base_url}/completion",
        timeout=60,
        json={"prompt": "List some fruits:", "n_predict": 12, "temperature": 0, "stream": True},
    ) as r:
        events = sse_events(r)
    assert events[-1]["stop"] is True and "timings" in events[-1]
    streamed = "".join(e["content"] for e in events)
    whole = httpx.post(
        f"{base_url}/completion", timeout=60, json={"prompt": "List some fruits:", "n_predict": 12, "temperature": 0}
    ).json()
    assert streamed == whole["content"]


def native_completion(base_url: str, **fields: object) -> httpx.Response:
    body = {"prompt": "Count: 1, 2, 3,", "temperature": 0, "ignore_eos": True, **fields}
    return HTTP.post(f"{base_url}/completion", json=body)


def test_native_completion_takes_llama_servers_aliases(base_url: str) -> None:
    # llama-server reads n_predict, then max_completion_tokens, then max_tokens; without them a
    # request with ignore_eos runs to the end of the context.
    assert native_completion(base_url, max_tokens=3).json()["tokens_predicted"] == 3
    assert native_completion(base_url, max_completion_tokens=4, max_tokens=9).json()["tokens_predicted"] == 4
    assert native_completion(base_url, n_predict=2, max_completion_tokens=4).json()["tokens_predicted"] == 2
    with HTTP.stream(
        "POST",
        f"{base_url}/completion",
        json={"prompt": "Count: 1, 2, 3,", "max_tokens": 5, "ignore_eos": True, "stream": True},
    ) as r:
        assert sse_events(r)[-1]["tokens_predicted"] == 5
    # logprobs stands for n_probs
    probs = native_completion(base_url, max_tokens=2, logprobs=3).json()["completion_probabilities"]
    assert len(probs) == 2 and all(len(p["top_logprobs"]) == 3 for p in probs)
    # n_predict wins over the OpenAI route's max_tokens too, as in llama-server
    oai = HTTP.post(
        f"{base_url}/v1/completions",
        json={"prompt": "Count: 1, 2, 3,", "max_tokens": 7, "n_predict": 3, "ignore_eos": True},
    ).json()
    assert oai["usage"]["completion_tokens"] == 3


def test_n_cmpl_answers_several_completions_of_each_prompt(base_url: str) -> None:
    greedy = {"n_predict": 6, "temperature": 0}
    alone = [HTTP.post(f"{base_url}/completion", json={"prompt": p, **greedy}).json()["content"] for p in ("Hi", "Yo")]
    both = HTTP.post(f"{base_url}/completion", json={"prompt": ["Hi", "Yo"], "n_cmpl": 2, **greedy}).json()
    # prompt by prompt, then completion by completion, as llama-server numbers its child tasks
    assert [b["index"] for b in both] == [0, 1, 2, 3]
    assert [b["content"] for b in both] == [alone[0], alone[0], alone[1], alone[1]]
    assert all(b["tokens_predicted"] == 6 for b in both)
    # `n` stands for n_cmpl; a stream tags each chunk with its completion
    with HTTP.stream("POST", f"{base_url}/completion", json={"prompt": "Hi", "n": 2, "stream": True, **greedy}) as r:
        events = sse_events(r)
    for index in (0, 1):
        mine = [e for e in events if e["index"] == index]
        assert "".join(e["content"] for e in mine) == alone[0]
        assert [e["stop"] for e in mine].count(True) == 1 and mine[-1]["tokens_predicted"] == 6
    # more completions than slots can never run at once
    r = HTTP.post(f"{base_url}/completion", json={"prompt": "Hi", "n_cmpl": 9, **greedy})
    assert r.status_code == 400 and "n_cmpl" in r.json()["error"]["message"]


def test_n_indent_ends_the_answer_at_a_shallow_line(base_url: str) -> None:
    # Code-completion clients (llama.vim, llama.vscode) send n_indent: after the first newline,
    # a line indented less than that ends the answer, without its text.
    body = {"prompt": "Fruits:\n- apple\n- banana\n-", "n_predict": 24, "temperature": 0}
    free = HTTP.post(f"{base_url}/completion", json=body).json()["content"]
    first_line = free[: free.index("\n") + 1]
    assert free.startswith(first_line + "-")  # the next line is not indented: n_indent 1 stops there
    bounded = HTTP.post(f"{base_url}/completion", json={**body, "n_indent": 1}).json()
    assert bounded["content"] == first_line and bounded["stop_type"] == "limit"
    assert bounded["generation_settings"]["n_indent"] == 1
    with HTTP.stream("POST", f"{base_url}/completion", json={**body, "n_indent": 1, "stream": True}) as r:
        assert "".join(e["content"] for e in sse_events(r)) == first_line
    # Indented deeply enough, the same list goes on to n_predict.
    assert HTTP.post(f"{base_url}/completion", json={**body, "n_indent": 0}).json()["content"] == free


def test_lazy_grammar_applies_from_its_trigger_and_preserved_tokens_show(base_url: str) -> None:
    # grammar_lazy and grammar_triggers, which llama-server's chat route fills from a template
    # and clients that build their own prompts send to /completion: free text until the trigger.
    body = {"prompt": "Fruits:\n- apple\n- banana\n-", "n_predict": 24, "temperature": 0}
    free = HTTP.post(f"{base_url}/completion", json=body).json()["content"]
    word = free.split("\n")[1].lstrip("- ")  # a fruit the model names on its second line
    grammar = {"grammar": f'root ::= "{word} juice!"'}
    lazy_body = {**body, **grammar, "grammar_lazy": True, "grammar_triggers": [{"type": 2, "value": word}]}
    lazy = HTTP.post(f"{base_url}/completion", json=lazy_body).json()
    assert lazy["content"] == free[: free.index(word)] + f"{word} juice!"
    assert lazy["stop_type"] == "eos"  # the grammar is complete: only the end may follow
    settings = lazy["generation_settings"]
    assert settings["grammar_lazy"] is True and settings["grammar_triggers"] == [{"type": 2, "value": word}]
    with HTTP.stream("POST", f"{base_url}/completion", json={**lazy_body, "stream": True}) as r:
        assert "".join(e["content"] for e in sse_events(r)) == lazy["content"]
    oai = HTTP.post(f"{base_url}/v1/completions", json={**lazy_body, "max_tokens": 24}).json()
    assert oai["choices"][0]["text"] == lazy["content"]  # llama-server reads them there too
    # Without grammar_lazy the grammar holds from the first token, as in llama-server.
    strict = HTTP.post(
        f"{base_url}/completion", json={**body, **grammar, "grammar_triggers": lazy_body["grammar_triggers"]}
    )
    assert strict.json()["content"] == f"{word} juice!"
    # A preserved special token's text is shown (the end of turn here), without -sp.
    chat = {"prompt": "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\n", "n_predict": 40, "temperature": 0}
    plain = HTTP.post(f"{base_url}/completion", json=chat).json()
    kept = HTTP.post(f"{base_url}/completion", json={**chat, "preserved_tokens": ["<|im_end|>"]}).json()
    assert plain["stop_type"] == kept["stop_type"] == "eos"
    assert kept["content"] == plain["content"] + "<|im_end|>"
    assert len(kept["generation_settings"]["preserved_tokens"]) == 1
    # A pattern std::regex rejects would end the process inside llama.cpp: a 400 naming it instead.
    bad = {**lazy_body, "grammar_triggers": [{"type": 2, "value": "(unclosed"}]}
    r = HTTP.post(f"{base_url}/completion", json=bad)
    assert r.status_code == 400 and "grammar_triggers[0].value" in r.json()["error"]["message"]
    no_trigger = HTTP.post(f"{base_url}/completion", json={**body, **grammar, "grammar_lazy": True})
    assert no_trigger.status_code == 400 and "grammar_triggers" in no_trigger.json()["error"]["message"]
    assert HTTP.get(f"{base_url}/health").status_code == 200


def busy_slots(base_url: str) -> int:
    return sum(1 for s in HTTP.get(f"{base_url}/slots").json() if s["is_processing"])


def wait_idle(base_url: str, timeout: float = 5.0) -> float:
    start = time.time()
    while time.time() - start < timeout:
        if busy_slots(base_url) == 0:
            return time.time() - start
        time.sleep(0.02)
    raise AssertionError("slots still busy")


def test_stream_disconnect_frees_the_slot(base_url: str) -> None:
    wait_idle(base_url)
    with httpx.stream(
        "POST",
        f"{base_url}/v1/chat/completions",
        timeout=60,
        json={
            "messages": [{"role": "user", "content": "Write a very long essay about the sea."}],
            # ignore_eos: the answer runs to the slot's context, so the slot is still busy when
            # checked, however fast the machine.
            "max_tokens": 1000,
            "ignore_eos": True,
            "stream": True,
            "extra": 1,
        },
    ) as r:
        # Keep the line iterator referenced: dropping it (a `break` out of a for loop does)
        # closes the response, which the server rightly reads as a disconnect.
        lines = r.iter_lines()
        seen = 0
        while seen < 3:
            if next(lines).startswith("data: "):
                seen += 1
        assert busy_slots(base_url) == 1
    assert wait_idle(base_url) < 2.0


def test_non_stream_disconnect_frees_the_slot(base_url: str) -> None:
    wait_idle(base_url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{base_url}/completion",
            timeout=httpx.Timeout(30, read=1.0),
            json={"prompt": "Write a very long essay about the sea.", "n_predict": 2000, "ignore_eos": True},
        )
    assert wait_idle(base_url) < 2.0


def test_disconnect_during_prompt_processing_frees_the_slot(base_url: str) -> None:
    wait_idle(base_url)
    host, port = base_url.removeprefix("http://").split(":")
    # ~500 tokens: one prefill step of a second or two; the abort lands when that step ends.
    body = json.dumps(
        {"prompt": "lorem ipsum dolor sit amet " * 50, "n_predict": 500, "cache_prompt": False, "stream": True}
    ).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        deadline = time.time() + 5
        while busy_slots(base_url) == 0 and time.time() < deadline:
            time.sleep(0.005)
        slot = HTTP.get(f"{base_url}/slots").json()
        busy = [s for s in slot if s["is_processing"]]
        assert busy and busy[0]["next_token"][0]["n_decoded"] == 0, "should still be in prompt processing"
    assert wait_idle(base_url, timeout=10) < 5.0


def test_light_endpoints_answer_while_every_slot_is_busy(base_url: str) -> None:
    wait_idle(base_url)
    stop = threading.Event()

    def hog() -> None:
        with httpx.stream(
            "POST",
            f"{base_url}/completion",
            timeout=120,
            json={"prompt": "Tell a long story.", "n_predict": 400, "ignore_eos": True, "stream": True},
        ) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    break

    threads = [threading.Thread(target=hog) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        deadline = time.time() + 10
        while busy_slots(base_url) < 8 and time.time() < deadline:
            time.sleep(0.05)
        assert busy_slots(base_url) == 8
        for path, method, body in (
            ("/health", "GET", None),
            ("/v1/models", "GET", None),
            ("/tokenize", "POST", {"content": "hello"}),
        ):
            t0 = time.time()
            r = HTTP.request(method, f"{base_url}{path}", json=body, timeout=5)
            assert r.status_code == 200
            assert time.time() - t0 < 0.5, path
    finally:
        stop.set()
        for t in threads:
            t.join()
    wait_idle(base_url)


def test_repeated_context_overflow_leaves_the_server_healthy(base_url: str) -> None:
    for _ in range(10):
        r = httpx.post(f"{base_url}/completion", json={"prompt": "x " * 3000, "n_predict": 1}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"
    assert HTTP.get(f"{base_url}/health").status_code == 200
    ok = httpx.post(f"{base_url}/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=30)
    assert ok.status_code == 200


def test_missing_max_tokens_stops_at_the_context(base_url: str) -> None:
    r = httpx.post(
        f"{base_url}/completion", timeout=120, json={"prompt": "Count: 1, 2, 3,", "ignore_eos": True, "temperature": 0}
    ).json()
    assert r["stop_type"] == "limit"
    assert r["tokens_evaluated"] + r["tokens_predicted"] <= 1024


def test_body_too_large_is_413(base_url: str) -> None:
    r = httpx.post(
        f"{base_url}/completion",
        content=b'{"prompt": "' + b"a" * (33 * 1024 * 1024) + b'"}',
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413
    assert r.json()["error"]["code"] == 413
