"""The Batch API's store and runner without a model: lines checked, run at most N at once at the
batch priority, retried on 429, recorded once, resumed after a stop, cancelled, expired; and
its routes are not tasks for --sleep-idle-seconds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from llamaserve.api.middleware import IdleMiddleware
from llamaserve.families.batches.lines import parse_input
from llamaserve.families.batches.runner import BATCH_PRIORITY, BatchRunner
from llamaserve.families.batches.store import BatchStore, Conflict, NotFound


def _line(i: int, url: str = "/v1/chat/completions", **body: Any) -> str:
    payload = {"messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4, **body}
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": payload})


def _store_with_batch(tmp_path: Path, lines: list[str]) -> tuple[BatchStore, str]:
    store = BatchStore(tmp_path / "batches")
    data = ("\n".join(lines) + "\n").encode()
    upload = store.add_file("in.jsonl", "batch", data)
    assert upload["bytes"] == len(data) and upload["purpose"] == "batch" and upload["object"] == "file"
    batch = store.create_batch(upload["id"], "/v1/chat/completions", {"job": "t"}, [["authorization", "Bearer k"]])
    assert batch["status"] == "validating" and batch["expires_at"] == batch["created_at"] + 86400
    return store, batch["id"]


class FakeApp:
    """Answers each line after `delay`, 429 first for the ids in `busy_once`; records what it saw."""

    def __init__(self, delay: float = 0.01, busy_once: frozenset[str] = frozenset()) -> None:
        self.delay = delay
        self.busy_once = set(busy_once)
        self.in_flight = 0
        self.most_in_flight = 0
        self.seen: list[dict[str, Any]] = []
        self.credentials: list[list[tuple[str, str]]] = []

    async def __call__(
        self, url: str, body: bytes, credentials: list[tuple[str, str]]
    ) -> tuple[int, Any, float | None]:
        data = json.loads(body)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        text = data["messages"][0]["content"]
        if text in self.busy_once:
            self.busy_once.discard(text)
            return 429, {"error": {"message": "busy"}}, 0.01
        self.seen.append(data)
        self.credentials.append(credentials)
        if data.get("max_tokens") == -5:
            return 400, {"error": {"code": 400, "message": "max_tokens: bad", "type": "invalid_request_error"}}, None
        return 200, {"object": "chat.completion", "echo": text}, None


async def _until(store: BatchStore, batch_id: str, statuses: tuple[str, ...], timeout: float = 10.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        obj = store.batch(batch_id)
        if obj["status"] in statuses:
            return obj
        await asyncio.sleep(0.02)
    raise AssertionError(f"batch stayed {store.batch(batch_id)['status']}")


def _records(store: BatchStore, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(x) for x in store.file_bytes(file_id).decode().splitlines()]


def test_bad_lines_are_refused_with_a_reason_and_the_rest_kept() -> None:
    text = "\n".join(
        [
            _line(0),
            "{not json",
            json.dumps([1, 2]),
            json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),
            _line(0),  # the same custom_id again
            json.dumps({"custom_id": "g", "method": "GET", "url": "/v1/completions", "body": {}}),
            _line(6, url="/v1/images/generations"),
            json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": "x"}),
            _line(8, stream=True),
            "",
            _line(10, url="/v1/embeddings"),
        ]
    )
    lines, bad = parse_input(text)
    assert [(ln.index, ln.custom_id, ln.url) for ln in lines] == [
        (0, "r0", "/v1/chat/completions"),
        (10, "r10", "/v1/embeddings"),
    ]
    codes = [(o.index, o.record["custom_id"], o.record["error"]["code"]) for o in bad]
    assert codes == [
        (1, None, "invalid_json_line"),
        (2, None, "invalid_json_line"),
        (3, None, "missing_custom_id"),
        (4, "r0", "duplicate_custom_id"),
        (5, "g", "invalid_method"),
        (6, "r6", "invalid_url"),
        (7, "b", "invalid_body"),
        (8, "r8", "invalid_body"),
    ]
    assert all(o.record["response"] is None and o.record["error"]["message"].startswith("line ") for o in bad)
    assert "/v1/images/generations" in bad[5].record["error"]["message"]


def test_a_batch_runs_bounded_at_batch_priority_and_every_line_is_answered_once(tmp_path: Path) -> None:
    lines = [_line(i) for i in range(30)] + ["oops", _line(99, max_tokens=-5), _line(77, priority=-3)]
    store, batch_id = _store_with_batch(tmp_path, lines)
    app = FakeApp(busy_once=frozenset({"q3", "q4"}))

    async def go() -> dict[str, Any]:
        runner = BatchRunner(store, app, lambda: 3)
        runner.wake()
        try:
            return await _until(store, batch_id, ("completed",))
        finally:
            await runner.stop()

    done = asyncio.run(go())
    assert app.most_in_flight == 3
    assert all(d["priority"] == BATCH_PRIORITY for d in app.seen)  # a line asking for -3 gets no earlier place
    assert all(c == [("authorization", "Bearer k")] for c in app.credentials)
    assert done["request_counts"] == {"total": 33, "completed": 31, "failed": 2}
    assert done["in_progress_at"] and done["finalizing_at"] and done["completed_at"]
    out = _records(store, done["output_file_id"])
    assert sorted(r["custom_id"] for r in out) == sorted([*(f"r{i}" for i in range(30)), "r77"])
    assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in out)
    assert all(r["id"].startswith("batch_req_") and r["response"]["request_id"].startswith("req_") for r in out)
    errors = _records(store, done["error_file_id"])
    assert {(r["custom_id"], (r["response"] or {}).get("status_code")) for r in errors} == {(None, None), ("r99", 400)}
    assert store.file(done["output_file_id"])["purpose"] == "batch_output"
    assert store.pending(batch_id) == []


def test_a_stopped_runner_resumes_with_the_unanswered_lines_only(tmp_path: Path) -> None:
    store, batch_id = _store_with_batch(tmp_path, [_line(i) for i in range(40)])
    first = FakeApp(delay=0.02)

    async def interrupted() -> None:
        runner = BatchRunner(store, first, lambda: 4)
        runner.wake()
        while store.batch(batch_id)["request_counts"]["completed"] < 10:
            await asyncio.sleep(0.01)
        await runner.stop()  # lines in flight are cancelled and keep no record

    asyncio.run(interrupted())
    store.close()
    reopened = BatchStore(tmp_path / "batches")
    assert reopened.batch(batch_id)["status"] == "in_progress"
    answered = 40 - len(reopened.pending(batch_id))
    assert 10 <= answered < 40
    second = FakeApp()

    async def resumed() -> dict[str, Any]:
        runner = BatchRunner(reopened, second, lambda: 4)
        runner.start()
        try:
            return await _until(reopened, batch_id, ("completed",))
        finally:
            await runner.stop()

    done = asyncio.run(resumed())
    assert len(second.seen) == 40 - answered
    ids = [r["custom_id"] for r in _records(reopened, done["output_file_id"])]
    assert sorted(ids) == sorted(f"r{i}" for i in range(40)) and len(set(ids)) == 40


def test_cancel_stops_the_lines_and_keeps_what_finished(tmp_path: Path) -> None:
    store, batch_id = _store_with_batch(tmp_path, [_line(i) for i in range(50)])
    app = FakeApp(delay=0.05)

    async def go() -> dict[str, Any]:
        runner = BatchRunner(store, app, lambda: 2)
        runner.wake()
        while store.batch(batch_id)["request_counts"]["completed"] < 4:
            await asyncio.sleep(0.01)
        obj = store.request_cancel(batch_id)
        assert obj["status"] == "cancelling" and obj["cancelling_at"]
        runner.cancel(batch_id)
        try:
            return await _until(store, batch_id, ("cancelled",))
        finally:
            await runner.stop()

    done = asyncio.run(go())
    kept = done["request_counts"]["completed"]
    assert 4 <= kept < 50 and done["cancelled_at"]
    assert len(_records(store, done["output_file_id"])) == kept
    assert store.request_cancel(batch_id)["status"] == "cancelled"  # again: no change, no error
    other_store, other = _store_with_batch(tmp_path / "x", [_line(0)])
    other_store.validate(other)
    other_store.finalize(other, "completed")
    with pytest.raises(Conflict, match="cannot be cancelled"):
        other_store.request_cancel(other)


def test_an_expired_batch_ends_with_its_unrun_lines_in_the_error_file(tmp_path: Path) -> None:
    store, batch_id = _store_with_batch(tmp_path, [_line(i) for i in range(5)])
    obj = store.validate(batch_id)
    assert obj["status"] == "in_progress"
    store.expire_pending(batch_id)
    done = store.finalize(batch_id, "expired")
    assert done["status"] == "expired" and done["expired_at"] and done["output_file_id"] is None
    assert {r["error"]["code"] for r in _records(store, done["error_file_id"])} == {"batch_expired"}


def test_files_list_page_and_delete(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b")
    assert store.list_files(None, 10, "desc", None)["data"] == []
    assert not (tmp_path / "b").exists()  # reading an absent store creates nothing
    with pytest.raises(NotFound):
        store.batch("batch_x")
    ids = [store.add_file(f"f{i}.jsonl", "batch", b"{}\n")["id"] for i in range(3)]
    page = store.list_files("batch", 2, "asc", None)
    assert [f["id"] for f in page["data"]] == ids[:2] and page["has_more"] and page["last_id"] == ids[1]
    rest = store.list_files("batch", 2, "asc", page["last_id"])
    assert [f["id"] for f in rest["data"]] == ids[2:] and not rest["has_more"]
    assert store.list_files("batch_output", 10, "desc", None)["data"] == []
    batch = store.create_batch(ids[0], "/v1/completions", None, [])
    with pytest.raises(Conflict, match=batch["id"]):
        store.delete_file(ids[0])
    assert store.delete_file(ids[1]) == {"id": ids[1], "object": "file", "deleted": True}
    with pytest.raises(NotFound):
        store.file(ids[1])
    assert not (tmp_path / "b" / "files" / ids[1]).exists()
    assert store.list_batches(20, None)["data"][0]["id"] == batch["id"]
    assert (tmp_path / "b" / "batches.sqlite3").stat().st_mode & 0o777 == 0o600


def test_a_deleted_input_file_fails_the_batch_with_a_reason(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "b")
    upload = store.add_file("in.jsonl", "batch", (_line(0) + "\n").encode())
    batch = store.create_batch(upload["id"], "/v1/chat/completions", None, [])
    (tmp_path / "b" / "files" / upload["id"]).unlink()
    failed = store.validate(batch["id"])
    assert failed["status"] == "failed" and failed["failed_at"]
    assert failed["errors"]["data"][0]["code"] == "file_not_found"


class CountingSleeper:
    """What IdleMiddleware asks of IdleSleeper: how many tasks it was told of."""

    def __init__(self) -> None:
        self.tasks = 0

    def start(self) -> None:
        pass

    def begin(self) -> None:
        self.tasks += 1

    async def awake(self) -> None:
        pass

    def end(self) -> None:
        pass


@pytest.mark.parametrize(
    ("method", "path", "task"),
    [
        ("GET", "/v1/batches/batch_1", False),  # a client polling its batch
        ("GET", "/v1/batches", False),
        ("POST", "/v1/files", False),
        ("POST", "/v1/batches", False),
        ("GET", "/v1/files/file-1/content", False),
        ("POST", "/v1/chat/completions", True),  # what a batch line is sent as: it wakes the model
        ("POST", "/v1/filesystem", True),
    ],
)
def test_the_batch_apis_own_routes_keep_no_model_awake(method: str, path: str, task: bool) -> None:
    sleeper = CountingSleeper()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    middleware = IdleMiddleware(app, sleeper)  # type: ignore[arg-type]
    asyncio.run(middleware({"type": "http", "method": method, "path": path}, None, None))  # type: ignore[arg-type]
    assert sleeper.tasks == (1 if task else 0)
