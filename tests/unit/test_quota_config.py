"""--api-keys-config without a server: the file's checks, the minute windows, the usage file,
the report a server sends the edge in front of it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llamaserve.config import ConfigError
from llamaserve.quota import report
from llamaserve.quota.limits import Limiter
from llamaserve.quota.policy import KeyPolicy, parse_keys_config
from llamaserve.quota.report import Reported, ReportReader
from llamaserve.quota.usage import Counts, UsageLedger, UsageStore

TOML = """
usage_db = "/tmp/u.sqlite3"
[[keys]]
name = "alice"
key = "sk-a"
requests_per_minute = 5
models = ["smol"]
[[keys]]
name = "ops"
key = "sk-o"
admin = true
"""


def test_toml_and_json_read_the_same_keys() -> None:
    from_toml = parse_keys_config(TOML, "keys.toml")
    json_text = (
        '{"usage_db": "/tmp/u.sqlite3", "keys": [{"name": "alice", "key": "sk-a", "requests_per_minute": 5,'
        ' "models": ["smol"]}, {"name": "ops", "key": "sk-o", "admin": true}]}'
    )
    from_json = parse_keys_config(json_text, "keys.json")
    assert from_toml == from_json
    alice = from_toml.policy_for("sk-a")
    assert alice == KeyPolicy(name="alice", requests_per_minute=5, models=frozenset({"smol"}))
    assert from_toml.policy_for("sk-nope") is None and from_toml.policy_for(None) is None
    assert from_toml.secrets == ("sk-a", "sk-o") and from_toml.usage_db == "/tmp/u.sqlite3"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[[keys]]\nname = "a"\nkey = "k"\nrpm = 5\n', "unknown field(s) rpm"),
        ('[[keys]]\nname = "a"\nkey = "k"\nmax_tokens = 0\n', "max_tokens must be a whole number"),
        ('[[keys]]\nname = "a"\nkey = "k"\ntokens_per_minute = "9"\n', "tokens_per_minute"),
        ('[[keys]]\nname = "a"\nkey = "k"\n[[keys]]\nname = "a"\nkey = "j"\n', "given to two keys"),
        ('[[keys]]\nname = "a"\nkey = "k"\n[[keys]]\nname = "b"\nkey = "k"\n', "repeats another entry's key"),
        ('[[keys]]\nname = "a"\n', "key must be a non-empty string"),
        ("keys = []\n", "non-empty list"),
        ("[[keys]\n", "not valid TOML"),
        ('{"keys": [', "not valid JSON"),
    ],
)
def test_a_bad_file_is_refused_naming_the_problem(text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=r"--api-keys-config") as caught:
        parse_keys_config(text, "keys.toml")
    assert named in str(caught.value)


def test_the_minute_windows_refuse_with_the_wait_until_room() -> None:
    limiter = Limiter()
    rpm = KeyPolicy(name="r", requests_per_minute=2)
    assert limiter.admit(rpm, 100.0) is None
    limiter.finish("r", 0, 100.5)
    assert limiter.admit(rpm, 110.0) is None
    limiter.finish("r", 0, 110.5)
    refused = limiter.admit(rpm, 120.0)
    assert refused is not None and refused.limit == "requests_per_minute" and refused.retry_after_s == 40
    assert limiter.admit(rpm, 160.5) is None  # the first one left the window

    tpm = KeyPolicy(name="t", tokens_per_minute=100)
    assert limiter.admit(tpm, 0.0) is None
    limiter.finish("t", 70, 1.0)
    assert limiter.admit(tpm, 2.0) is None  # 70 of 100: still under
    limiter.finish("t", 50, 3.0)
    refused = limiter.admit(tpm, 4.0)
    assert refused is not None and refused.limit == "tokens_per_minute" and refused.retry_after_s == 57
    assert limiter.admit(tpm, 61.5) is None  # the 70 left the window: 50 of 100

    conc = KeyPolicy(name="c", max_concurrent=1)
    assert limiter.admit(conc, 0.0) is None
    refused = limiter.admit(conc, 0.1)
    assert refused is not None and refused.limit == "max_concurrent"
    limiter.finish("c", 0, 0.2)
    assert limiter.admit(conc, 0.3) is None


def test_usage_is_kept_in_the_file_and_concurrent_records_all_land(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"

    async def record_many() -> None:
        ledger = UsageLedger(UsageStore(path))
        await asyncio.gather(*(ledger.record("a", "m", Counts(1, 10, 2, 3, i % 2)) for i in range(50)))
        await ledger.record("b", "m", Counts(requests=1))

    asyncio.run(record_many())
    again = UsageLedger(UsageStore(path))
    assert again.rows() == [
        {"key": "a", "model": "m", "requests": 50, "prompt_tokens": 500, "cached_tokens": 100,
         "completion_tokens": 150, "errors": 25},
        {"key": "b", "model": "m", "requests": 1, "prompt_tokens": 0, "cached_tokens": 0,
         "completion_tokens": 0, "errors": 0},
    ]  # fmt: skip
    assert again.rows("b")[0]["key"] == "b"
    text = again.prometheus().decode()
    assert 'llamaserve:key_requests_total{key="a",model="m"} 50' in text
    assert "# TYPE llamaserve:key_errors_total counter" in text


def test_the_edge_reads_the_servers_report_and_the_client_never_sees_it() -> None:
    sse = [(b"content-type", b"text/event-stream")]
    whole = ReportReader()
    assert whole.headers([*sse, (report.HEADER, report.header_value(None, "my model"))]) == sse
    event = b'data: {"text": "x"}\n\n'
    assert whole.body(event) == event
    assert whole.body(event + report.comment((12, 4, 7)) + b"data: [DONE]\n\n") == event + b"data: [DONE]\n\n"
    assert whole.counts() == Reported(12, 4, 7, "my model")

    split = ReportReader()
    split.headers(sse)
    closing = event + report.comment((30, 0, 9))
    split.body(closing[:30])
    split.body(closing[30:])
    assert split.counts() == Reported(30, 0, 9, "")

    cut_short = ReportReader()  # the stream ended without its comment: one token per event
    cut_short.headers(sse)
    for _ in range(5):
        cut_short.body(event)
    assert cut_short.counts().completion == 5

    answer = ReportReader()  # a whole JSON answer: the counts come in the header
    kept = answer.headers([(b"content-type", b"application/json"), (report.HEADER, b"5 1 2 smol")])
    assert kept == [(b"content-type", b"application/json")]
    assert answer.counts() == Reported(5, 1, 2, "smol")
