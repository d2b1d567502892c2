"""The OpenAI Batch API through the official SDK on a real SmolLM2 server: upload, create, watch,
a kill in the middle and a restart on the same folder, the output and error files, cancel,
listing, deletion, the refusals, and embedding lines where the server serves embeddings.

The store and the runner are tested without a model in tests/unit/test_batch_store_runner.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from .conftest import RunningServer, start_server, stop_server

KEY = "batch-key"
BAD_NOT_JSON = 57
BAD_URL = 131
N_LINES = 200


def _server_args(model_path: str, folder: Path, *extra: str) -> list[str]:
    return ["-m", model_path, "-np", "8", "-c", "4096", "-t", "2", "--temp", "0", "--api-key", KEY,
            "--body-limit", "1", "--batch-dir", str(folder), *extra]  # fmt: skip


def _client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def _line(i: int) -> dict[str, Any]:
    """Chat and completion lines in turn, 4 tokens each."""
    if i % 3 == 2:
        body: dict[str, Any] = {"model": "m", "prompt": f"Number {i} is", "max_tokens": 4}
        return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions", "body": body}
    body = {"model": "m", "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 4}
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def _input_file() -> bytes:
    rows = []
    for i in range(N_LINES):
        if i == BAD_NOT_JSON:
            rows.append('{"custom_id": "broken", "method": "POST",')
        elif i == BAD_URL:
            rows.append(json.dumps({**_line(i), "url": "/v1/moderations"}))
        else:
            rows.append(json.dumps(_line(i)))
    return ("\n".join(rows) + "\n").encode()


def _wait(client: openai.OpenAI, batch_id: str, done: Any, timeout: float = 120.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} is still {client.batches.retrieve(batch_id)}")


def _records(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(row) for row in client.files.content(file_id).text.splitlines()]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batches")


@pytest.fixture(scope="module")
def restarted(model_path: str, folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A 200-line batch killed (SIGKILL) part way, then finished by a new server on the same folder."""
    tmp = tmp_path_factory.mktemp("batch-servers")
    first = start_server(_server_args(model_path, folder), tmp)
    client = _client(first)
    upload = client.files.create(file=("nightly.jsonl", _input_file()), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "nightly"}
    )
    part_way = _wait(client, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 30)
    first.process.kill()
    first.process.wait(timeout=10)
    second = start_server(_server_args(model_path, folder), tmp)
    try:
        yield {"server": second, "upload": upload, "created": batch, "part_way": part_way}
    finally:
        stop_server(second)


def test_files_create_and_batches_create_answer_openais_shapes(restarted: dict[str, Any]) -> None:
    upload, created = restarted["upload"], restarted["created"]
    assert upload.object == "file" and upload.id.startswith("file-") and upload.purpose == "batch"
    assert upload.filename == "nightly.jsonl" and upload.bytes == len(_input_file())
    assert created.object == "batch" and created.id.startswith("batch_") and created.status == "validating"
    assert created.input_file_id == upload.id and created.endpoint == "/v1/chat/completions"
    assert created.completion_window == "24h" and created.metadata == {"job": "nightly"}
    assert created.expires_at == created.created_at + 24 * 3600


def test_a_killed_batch_resumes_and_answers_every_line_once(restarted: dict[str, Any]) -> None:
    part_way = restarted["part_way"]
    assert part_way.status == "in_progress" and part_way.request_counts.total == N_LINES
    assert part_way.request_counts.completed < N_LINES - 2  # the kill came in the middle
    client = _client(restarted["server"])
    done = _wait(client, restarted["created"].id, lambda b: b.status not in ("validating", "in_progress", "finalizing"))
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (200, 198, 2)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert done.usage is not None and 0 < done.usage.output_tokens <= 198 * 4
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    out = _records(client, done.output_file_id)
    ids = [r["custom_id"] for r in out]
    assert len(out) == 198 and len(set(ids)) == 198
    assert done.usage.output_tokens == sum(r["response"]["body"]["usage"]["completion_tokens"] for r in out)
    assert set(ids) == {f"req-{i}" for i in range(N_LINES) if i not in (BAD_NOT_JSON, BAD_URL)}
    for record in out:
        response = record["response"]
        assert record["error"] is None and record["id"].startswith("batch_req_")
        assert response["status_code"] == 200 and response["request_id"].startswith("req_")
        i = int(record["custom_id"].split("-")[1])
        body = response["body"]
        if i % 3 == 2:
            assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] <= 4
        else:
            assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] <= 4
            assert body["choices"][0]["message"]["role"] == "assistant"
    errors = _records(client, done.error_file_id)
    assert [(r["custom_id"], r["response"], r["error"]["code"]) for r in errors] == [
        (None, None, "invalid_json_line"),
        (f"req-{BAD_URL}", None, "invalid_url"),
    ]
    assert f"line {BAD_URL + 1}" in errors[1]["error"]["message"] and "/v1/moderations" in errors[1]["error"]["message"]


def test_files_and_batches_list_retrieve_and_delete(restarted: dict[str, Any]) -> None:
    client = _client(restarted["server"])
    batch_id, upload = restarted["created"].id, restarted["upload"]
    assert batch_id in [b.id for b in client.batches.list(limit=5)]
    done = client.batches.retrieve(batch_id)
    outputs = {f.id for f in client.files.list(purpose="batch_output")}
    assert {done.output_file_id, done.error_file_id} <= outputs
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert client.files.retrieve(upload.id).bytes == upload.bytes
    assert client.files.content(upload.id).content == _input_file()
    deleted = client.files.delete(upload.id)
    assert deleted.deleted and deleted.id == upload.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)


def test_cancel_stops_a_running_batch_and_keeps_what_finished(restarted: dict[str, Any]) -> None:
    client = _client(restarted["server"])
    rows = [{"custom_id": "embed", "method": "POST", "url": "/v1/embeddings", "body": {"input": "a cat"}}]
    for i in range(40):
        body = {"prompt": f"Story {i}:", "max_tokens": 48, "ignore_eos": True}
        rows.append({"custom_id": f"long-{i}", "method": "POST", "url": "/v1/completions", "body": body})
    upload = client.files.create(file=("long.jsonl", "\n".join(json.dumps(r) for r in rows).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    _wait(client, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 2)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = _wait(client, batch.id, lambda b: b.status == "cancelled", timeout=30)
    assert done.cancelled_at and 2 <= done.request_counts.completed < 40
    assert len(_records(client, done.output_file_id)) == done.request_counts.completed
    # This server generates; its embeddings route says why it refuses, and the line is an error.
    (embed,) = _records(client, done.error_file_id)
    assert embed["custom_id"] == "embed" and embed["response"]["status_code"] == 501
    assert "--embedding" in embed["response"]["body"]["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="cannot be cancelled"):
        client.batches.cancel(restarted["created"].id)


def test_bad_requests_are_4xx_naming_the_problem(restarted: dict[str, Any]) -> None:
    server = restarted["server"]
    client = _client(server)
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/completions", completion_window="24h")
    upload = client.files.create(file=("one.jsonl", json.dumps(_line(0)).encode()), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="output_expires_after"):
        client.batches.create(
            input_file_id=upload.id,
            endpoint="/v1/completions",
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 3600},
        )
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.files.create(file=("x.jsonl", b""), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.BadRequestError, match="limit"):
        client.batches.list(limit=1000)
    # An upload is a request body: --body-limit (1 MiB on this server) bounds it.
    with pytest.raises(openai.APIStatusError) as too_big:
        client.files.create(file=("big.jsonl", (json.dumps(_line(0)) + "\n").encode() * 12_000), purpose="batch")
    assert too_big.value.status_code == 413
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(f"{server.url}/v1/files", headers=auth, json={"purpose": "batch"})
    assert r.status_code == 400 and "multipart" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://127.0.0.1:3000"},  # another origin of this machine, an older browser
    ],
)
def test_a_page_of_another_site_cannot_upload_or_start_a_batch(
    restarted: dict[str, Any], headers: dict[str, str]
) -> None:
    server = restarted["server"]
    auth = {"Authorization": f"Bearer {KEY}", **headers}
    before = len(_client(server).files.list().data)
    r = httpx.post(
        f"{server.url}/v1/files", headers=auth, files={"file": ("x.jsonl", b"{}\n")}, data={"purpose": "batch"}
    )
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = httpx.post(f"{server.url}/v1/batches", headers={**auth, "Content-Type": "text/plain"}, content=b"{}")
    assert r.status_code == 403
    assert len(_client(server).files.list().data) == before


def test_embedding_lines_run_where_the_server_serves_embeddings(model_path: str, tmp_path: Path) -> None:
    server = start_server(["-m", model_path, "--embedding", "--pooling", "mean", "-np", "2", "-c", "1024", "-t", "2",
                           "--batch-dir", str(tmp_path / "b")], tmp_path)  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)
        rows = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                 "body": {"input": f"sentence {i}", "encoding_format": "float"}} for i in range(4)]  # fmt: skip
        rows.append({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}})  # fmt: skip
        upload = client.files.create(file=("e.jsonl", "\n".join(json.dumps(r) for r in rows).encode()), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
        done = _wait(client, batch.id, lambda b: b.status == "completed", timeout=60)
        out = _records(client, done.output_file_id)
        assert sorted(r["custom_id"] for r in out) == ["e0", "e1", "e2", "e3"]
        assert all(len(r["response"]["body"]["data"][0]["embedding"]) > 100 for r in out)
        (chat,) = _records(client, done.error_file_id)
        assert chat["custom_id"] == "chat" and "--embeddings" in chat["response"]["body"]["error"]["message"]
    finally:
        stop_server(server)
