"""A runner without a model: token t's text is a fixed piece, and each sequence
generates a script of tokens given per prompt, so scheduler behaviour can be
checked exactly and in milliseconds."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from llamaserve.engine.runner import PlanRow, Sample, StepResult, verify_draft
from llamaserve.engine.types import SamplingParams

EOG = 0


@dataclass
class FakeSampler:
    seed: int = 0
    accepted: list[int] = field(default_factory=list)
    closed: bool = False

    def accept(self, token: int) -> None:
        self.accepted.append(token)

    def sample(self, ctx: object, index: int) -> int:
        raise AssertionError("the fake runner samples by script")

    def draw(self, weights: list[float]) -> int:
        """One token from a known distribution, with this sampler's own random numbers (its seed)."""
        rng: random.Random = self.__dict__.setdefault("_rng", random.Random(self.seed))
        token: int = rng.choices(range(len(weights)), weights)[0]
        self.accepted.append(token)
        return token

    def close(self) -> None:
        self.closed = True


class FakeRunner:
    def __init__(
        self,
        *,
        n_ctx_seq: int = 256,
        n_batch: int = 16,
        n_seq_max: int = 4,
        pieces: dict[int, bytes] | None = None,
        n_ubatch: int | None = None,
    ) -> None:
        self.n_ctx_seq = n_ctx_seq
        self.n_batch = n_batch
        self.n_ubatch = n_batch if n_ubatch is None else n_ubatch
        self.n_seq_max = n_seq_max
        self.pieces = pieces or {}
        # scripts[prompt] = the tokens generated after that prompt, in order;
        # past the end of a script (or for an unknown prompt) token 7 repeats
        self.scripts: dict[tuple[int, ...], list[int]] = {}
        # per sequence, its cells as [position, token], like a KV cache's
        self.cells: dict[int, list[list[int]]] = {i: [] for i in range(n_seq_max)}
        self.plans: list[list[PlanRow]] = []
        self.removed: list[tuple[int, int, int]] = []
        self.copies: list[tuple[int, int]] = []
        self.fail_next = False
        self.full_next = False  # the next decode finds no room in the KV cache (llama_decode's 1)
        self.missing_token: int | None = None  # a row holding it is not decoded (failed_rows)
        self.shifts: list[tuple[int, int, int, int]] = []
        self.lora: tuple[float, ...] = ()
        self.lora_per_step: list[tuple[float, ...]] = []

    def tokens(self, seq_id: int) -> list[int]:
        """The sequence's tokens in position order; positions must be 0..n-1."""
        cells = sorted(self.cells[seq_id])
        assert [p for p, _ in cells] == list(range(len(cells))), f"seq {seq_id}: holes in {cells}"
        return [t for _, t in cells]

    # When set: tokens are drawn from dist(sequence so far) with the sampler's seed, not scripted.
    dist: Callable[[list[int]], list[float]] | None = None

    def new_sampler(self, params: SamplingParams) -> FakeSampler:
        return FakeSampler(seed=params.seed)

    def step(self, plan: list[PlanRow]) -> StepResult:
        # Media rows (negative placeholders) go to a batch of embeddings of their own.
        text = sum(len(r.tokens) for r in plan if r.tokens and r.tokens[0] >= 0)
        media = sum(len(r.tokens) for r in plan if r.tokens and r.tokens[0] < 0)
        assert text <= self.n_ubatch and media <= self.n_ubatch, "plan exceeds the micro-batch budget"
        self.plans.append(plan)
        self.lora_per_step.append(self.lora)
        if self.fail_next:
            self.fail_next = False
            return StepResult([[] for _ in plan], error="boom")
        if self.full_next:
            self.full_next = False
            return StepResult([[] for _ in plan], error="no KV slot", no_space=True)
        samples: list[list[Sample]] = []
        failed: dict[int, str] = {}
        for index, row in enumerate(plan):
            if self.missing_token is not None and self.missing_token in row.tokens:
                failed[index] = "media gone"  # as LlamaRunner reports a media row it cannot decode
                samples.append([])
                continue
            seq = self.tokens(row.seq_id)
            assert row.start_pos == len(seq), f"seq {row.seq_id}: pos {row.start_pos} != kv {len(seq)}"
            self.cells[row.seq_id] += [[row.start_pos + i, t] for i, t in enumerate(row.tokens)]
            if row.draft:
                samples.append(self._verify(row, seq))
                continue
            seq += row.tokens
            # choice i of an n > 1 group draws script token + i, so choices differ visibly
            samples.append([self._sample(seq, s, i) for i, s in enumerate(row.samplers)])
        return StepResult(samples, failed_rows=failed)

    def seq_copy(self, src: int, dst: int) -> None:
        self.copies.append((src, dst))
        self.cells[dst] = [list(c) for c in self.cells[src]]

    def _verify(self, row: PlanRow, seq: list[int]) -> list[Sample]:
        sampler = row.samplers[0]
        known = seq + row.tokens
        n_before = len(seq) + 1  # the sequence up to the row's first token
        return verify_draft(row, lambda i: self._sample(known[: n_before + i], sampler), self.is_eog)

    def _sample(self, seq: list[int], sampler: object, choice: int = 0) -> Sample:
        if self.dist is not None and isinstance(sampler, FakeSampler):
            return Sample(sampler.draw(self.dist(seq)))
        return Sample(self._next(seq) + choice)

    def _next(self, seq: list[int]) -> int:
        for prompt, script in self.scripts.items():
            if tuple(seq[: len(prompt)]) == prompt:
                i = len(seq) - len(prompt)
                return script[i] if i < len(script) else 7
        return 7

    def seq_remove(self, seq_id: int, p0: int, p1: int = -1) -> None:
        self.removed.append((seq_id, p0, p1))
        end = p1 if p1 >= 0 else 1 << 30
        self.cells[seq_id] = [c for c in self.cells[seq_id] if not p0 <= c[0] < end]

    def seq_shift(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.shifts.append((seq_id, p0, p1, delta))
        for cell in self.cells[seq_id]:
            if p0 <= cell[0] < p1:
                cell[0] += delta

    can_shift = True

    def set_lora(self, scales: tuple[float, ...]) -> None:
        self.lora = scales

    def seq_state(self, seq_id: int) -> bytes:
        return json.dumps(self.cells[seq_id]).encode()

    def set_seq_state(self, seq_id: int, data: bytes) -> bool:
        assert not self.cells[seq_id], "state restored into a sequence that is not empty"
        self.cells[seq_id] = json.loads(data)
        return True

    def save_seq_file(self, path: str, seq_id: int, tokens: list[int]) -> int:
        data = json.dumps({"cells": self.cells[seq_id], "tokens": tokens}).encode()
        with open(path, "wb") as fh:
            fh.write(data)
        return len(data)

    def load_seq_file(self, path: str, seq_id: int) -> tuple[int, list[int]]:
        with open(path, "rb") as fh:
            data = fh.read()
        saved = json.loads(data)
        self.cells[seq_id] = saved["cells"]
        return len(data), saved["tokens"]

    def piece(self, token: int, *, special: bool = False) -> bytes:
        return self.pieces.get(token, f"<{token}>".encode())

    def is_eog(self, token: int) -> bool:
        return token == EOG
