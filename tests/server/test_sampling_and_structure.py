"""Samplers, log-probabilities, n choices and structured output against SmolLM2."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
from pydantic import BaseModel

HTTP = httpx.Client(timeout=120)


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=120)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_every_sampler_knob_is_accepted_and_changes_nothing_when_neutral(base_url: str) -> None:
    base = {"prompt": "The capital of France is", "n_predict": 6, "temperature": 0, "seed": 1}
    plain = HTTP.post(f"{base_url}/completion", json=base).json()["content"]
    neutral = {
        "dynatemp_range": 0,
        "dynatemp_exponent": 1,
        "top_k": 40,
        "top_p": 1.0,
        "min_p": 0.0,
        "typical_p": 1.0,
        "top_n_sigma": -1,
        "xtc_probability": 0,
        "xtc_threshold": 0.1,
        "repeat_penalty": 1.0,
        "repeat_last_n": 64,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "dry_multiplier": 0,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": -1,
        "dry_sequence_breakers": ["\n"],
        "mirostat": 0,
        "mirostat_tau": 5,
        "mirostat_eta": 0.1,
        "min_keep": 0,
        "ignore_eos": False,
        "samplers": ["top_k", "temperature"],
    }
    r = HTTP.post(f"{base_url}/completion", json={**base, **neutral})
    assert r.status_code == 200, r.text
    assert r.json()["content"] == plain


def test_active_samplers_run(base_url: str) -> None:
    for extra in (
        {"mirostat": 2, "temperature": 0.8},
        {"mirostat": 1, "temperature": 0.8},
        {"dry_multiplier": 0.8, "temperature": 0.8},
        {"xtc_probability": 0.5, "xtc_threshold": 0.1},
        {"typical_p": 0.5},
        {"top_n_sigma": 1.0},
        {"dynatemp_range": 0.5},
        {"repeat_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.5},
        {"samplers": "kt"},
    ):
        r = HTTP.post(f"{base_url}/completion", json={"prompt": "Once upon a time", "n_predict": 8, "seed": 3, **extra})
        assert r.status_code == 200, (extra, r.text)
        assert r.json()["tokens_predicted"] > 0


@pytest.mark.parametrize(
    "field,value",
    [
        ("dry_allowed_length", -1),
        ("top_k", -1),
        ("n_probs", 10_000),
        ("min_keep", -3),
        ("mirostat", 3),
        ("temperature", float("inf")),
        ("seed", -2),
        ("repeat_last_n", -5),
        ("n_predict", -7),
        ("dry_penalty_last_n", -9),
        ("top_p", 1.5),
        ("samplers", ["nonsense"]),
    ],
)
def test_out_of_range_knobs_are_400_naming_the_field(base_url: str, field: str, value: object) -> None:
    body = json.dumps({"prompt": "x", "n_predict": 1, field: value}, allow_nan=True)
    r = HTTP.post(f"{base_url}/completion", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, (field, r.text)
    assert field in r.json()["error"]["message"]


def test_huge_n_and_top_logprobs_are_rejected(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=ask("hi"), max_tokens=2, n=1_000_000)
    assert "n" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=ask("hi"), max_tokens=2, n=9)  # 8 slots
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=ask("hi"), max_tokens=2, logprobs=True, top_logprobs=21)


def test_logit_bias_forms(base_url: str) -> None:
    base = {"prompt": "The capital of France is", "n_predict": 1, "temperature": 0, "n_probs": 1}
    first = HTTP.post(f"{base_url}/completion", json=base).json()["completion_probabilities"][0]
    tok, text = first["id"], first["token"]
    for bias in ([[tok, False]], [[text, False]], {str(tok): -100}):
        r = HTTP.post(f"{base_url}/completion", json={**base, "logit_bias": bias}).json()
        assert r["completion_probabilities"][0]["id"] != tok, bias
    boosted = HTTP.post(f"{base_url}/completion", json={**base, "logit_bias": [[42, 100]]}).json()
    assert boosted["completion_probabilities"][0]["id"] == 42


def test_chat_logprobs_shape_and_consistency(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m", messages=ask("Say hello."), max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and len(content) == r.usage.completion_tokens  # type: ignore[union-attr]
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob >= item.top_logprobs[-1].logprob
        # greedy: the chosen token is the most likely one
        assert math.isclose(item.logprob, item.top_logprobs[0].logprob, abs_tol=1e-5)
        assert bytes(item.bytes or []).decode(errors="replace") == item.token
    text = "".join(i.token for i in content)
    assert text.startswith(r.choices[0].message.content or "")
    streamed = [
        c
        for c in client.chat.completions.create(
            model="m",
            messages=ask("Say hello."),
            max_tokens=6,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
            stream=True,
        )
        if c.choices and c.choices[0].logprobs
    ]
    assert [i.token for c in streamed for i in c.choices[0].logprobs.content] == [i.token for i in content]  # type: ignore[union-attr]


def test_legacy_completion_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model="m", prompt="One, two, three,", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4  # type: ignore[arg-type]
    assert "".join(lp.tokens) == r.choices[0].text  # type: ignore[arg-type]
    assert lp.text_offset == sorted(lp.text_offset)  # type: ignore[arg-type]


def test_n_choices_share_the_prompt(client: openai.OpenAI, base_url: str) -> None:
    r = client.chat.completions.create(
        model="m", messages=ask("Invent a fruit name."), max_tokens=8, temperature=1.0, n=3, seed=5
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1
    assert r.usage is not None
    assert r.usage.completion_tokens <= 24
    timings = (r.model_extra or {})["timings"]
    # the prompt was decoded once: the usage counts it once
    assert r.usage.prompt_tokens == timings["prompt_n"] + timings["cache_n"]
    chunks = list(
        client.chat.completions.create(
            model="m", messages=ask("Invent a fruit name."), max_tokens=8, temperature=1.0, n=2, seed=5, stream=True
        )
    )
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 2


def test_json_object_response_format_gives_json(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m",
        messages=ask("Describe a dog as JSON."),
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    else:
        assert (r.choices[0].message.content or "").lstrip().startswith("{")


class Pet(BaseModel):
    name: str
    species: str
    age: int


def test_beta_parse_with_a_pydantic_schema(client: openai.OpenAI) -> None:
    r = client.beta.chat.completions.parse(
        model="m", messages=ask("Invent a pet. Reply in JSON."), response_format=Pet, max_tokens=80, temperature=0
    )
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet) and pet.name


def test_json_schema_constraints_are_enforced(base_url: str) -> None:
    schema = {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "count": {"type": "integer", "minimum": 3, "maximum": 7},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 2},
        },
        "required": ["color", "count", "tags"],
        "additionalProperties": False,
    }
    r = HTTP.post(
        f"{base_url}/completion",
        json={
            "prompt": "A JSON object about a balloon:",
            "n_predict": 80,
            "temperature": 0.7,
            "seed": 2,
            "json_schema": schema,
        },
    ).json()
    value = json.loads(r["content"])
    assert value["color"] in ("red", "green", "blue")
    assert 3 <= value["count"] <= 7
    assert 1 <= len(value["tags"]) <= 2 and all(len(t) <= 8 for t in value["tags"])
    assert set(value) == {"color", "count", "tags"}


def test_gbnf_grammar(base_url: str) -> None:
    r = HTTP.post(
        f"{base_url}/completion",
        json={"prompt": "Answer yes or no: is the sky blue?", "n_predict": 4, "grammar": 'root ::= ("yes" | "no") "."'},
    ).json()
    assert r["content"] in ("yes.", "no.")


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"grammar": "root ::= ("}, "grammar"),
        ({"json_schema": {"type": "wizard"}}, "json_schema"),
        ({"json_schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}}, "pattern"),
        ({"json_schema": {"$ref": "#/$defs/missing"}}, "$ref"),
        ({"grammar": 'root ::= "a"', "json_schema": {"type": "object"}}, "only one"),
    ],
)
def test_unusable_structure_is_a_400_naming_the_part(base_url: str, body: dict, needle: str) -> None:
    r = HTTP.post(f"{base_url}/completion", json={"prompt": "x", "n_predict": 2, **body})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_unusable_response_format_is_400_not_unconstrained(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="m",
            messages=ask("x"),
            max_tokens=2,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "not": {"type": "null"}}},
            },
        )
    assert "not" in str(e.value)


def test_echo_returns_prompt_logprobs(client: openai.OpenAI, base_url: str) -> None:
    prompt = "The quick brown fox jumps over the lazy dog"
    n_prompt = len(HTTP.post(f"{base_url}/tokenize", json={"content": prompt}).json()["tokens"])
    r = client.completions.create(model="m", prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == prompt
    assert lp is not None and len(lp.tokens) == n_prompt  # type: ignore[arg-type]
    assert lp.token_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])  # type: ignore[index,operator]
    assert "".join(lp.tokens) == prompt  # type: ignore[arg-type]

    # a likely continuation scores higher than an unlikely one
    def score(text: str) -> float:
        out = client.completions.create(model="m", prompt=text, max_tokens=0, echo=True, logprobs=0)
        return sum(out.choices[0].logprobs.token_logprobs[1:])  # type: ignore[union-attr,arg-type,index]

    assert score("The capital of France is Paris") > score("The capital of France is banana")
    gen = client.completions.create(model="m", prompt=prompt, max_tokens=3, echo=True, logprobs=2, temperature=0)
    assert gen.choices[0].text.startswith(prompt)
    assert len(gen.choices[0].logprobs.tokens) == n_prompt + gen.usage.completion_tokens  # type: ignore[union-attr]
