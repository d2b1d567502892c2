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


@dataclass
class FakeCell:
    """One KV cell: a position, the token decoded there, and the sequences holding it."""

    pos: int
    token: int
    seqs: set[int]


class FakeRunner:
    """A KV cache of cells as llama.cpp keeps them: with ``unified`` (the default) one pool
    where seq_copy tags cells and seq_shift moves a cell for every sequence holding it, so a
    shared cell moved for one sequence shows up as a hole in the others; without it each
    sequence has cells of its own and seq_copy copies them."""

    def __init__(
        self,
        *,
        n_ctx_seq: int = 256,
        n_batch: int = 16,
        n_seq_max: int = 4,
        pieces: dict[int, bytes] | None = None,
        n_ubatch: int | None = None,
        unified: bool = True,
        sharing_note: str = "",
    ) -> None:
        self.n_ctx_seq = n_ctx_seq
        self.n_batch = n_batch
        self.n_ubatch = n_batch if n_ubatch is None else n_ubatch
        self.n_seq_max = n_seq_max
        self.pieces = pieces or {}
        # scripts[prompt] = the tokens generated after that prompt, in order;
        # past the end of a script (or for an unknown prompt) token 7 repeats
        self.scripts: dict[tuple[int, ...], list[int]] = {}
        self.unified = unified
        self.sharing_note = sharing_note if unified else "split KV"
        self.kv: list[FakeCell] = []
        self.states_set = 0  # set_seq_state calls
        self.plans: list[list[PlanRow]] = []
        self.removed: list[tuple[int, int, int]] = []
        self.copies: list[tuple[int, int]] = []
        self.fail_next = False
        self.full_next = False  # the next decode finds no room in the KV cache (llama_decode's 1)
        self.missing_token: int | None = None  # a row holding it is not decoded (failed_rows)
        self.shifts: list[tuple[int, int, int, int]] = []
        self.lora: tuple[float, ...] = ()
        self.lora_per_step: list[tuple[float, ...]] = []

    @property
    def shares_cells(self) -> bool:
        return not self.sharing_note

    @property
    def cells(self) -> dict[int, list[list[int]]]:
        """Per sequence, its cells as [position, token] (a copy)."""
        out: dict[int, list[list[int]]] = {i: [] for i in range(self.n_seq_max)}
        for cell in self.kv:
            for seq in cell.seqs:
                out[seq].append([cell.pos, cell.token])
        return out

    def put(self, seq_id: int, tokens: list[int]) -> None:
        """Give an empty sequence cells of its own holding tokens at 0..n-1."""
        assert not self.cells[seq_id]
        self.kv += [FakeCell(i, t, {seq_id}) for i, t in enumerate(tokens)]

    @property
    def n_cells_used(self) -> int:
        return len(self.kv)

    def tokens(self, seq_id: int) -> list[int]:
        """The sequence's tokens in position order; positions must be 0..n-1."""
        cells = sorted([c.pos, c.token] for c in self.kv if seq_id in c.seqs)
        assert [p for p, _ in cells] == list(range(len(cells))), f"seq {seq_id}: holes in {cells}"
        return [t for _, t in cells]

    # When set: tokens are drawn from dist(sequence so far) with the sampler's seed, not scripted.
    dist: Callable[[list[int]], list[float]] | None = None

    def new_sampler(self, params: SamplingParams) -> FakeSampler:
        return FakeSampler(seed=params.seed)

    def step(self, plan: list[PlanRow], meanwhile: Callable[[], None] | None = None) -> StepResult:
        if meanwhile is not None:  # a CPU runner's order: the scheduler's bookkeeping first
            meanwhile()
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
            self.kv += [FakeCell(row.start_pos + i, t, {row.seq_id}) for i, t in enumerate(row.tokens)]
            if row.draft:
                samples.append(self._verify(row, seq))
                continue
            seq += row.tokens
            # choice i of an n > 1 group draws script token + i, so choices differ visibly
            samples.append([self._sample(seq, s, i) for i, s in enumerate(row.samplers)])
        return StepResult(samples, failed_rows=failed)

    def seq_copy(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.copies.append((src, dst))
        end = p1 if p1 >= 0 else 1 << 30
        start = max(p0, 0)
        if self.unified:
            for cell in self.kv:
                if src in cell.seqs and start <= cell.pos < end:
                    cell.seqs.add(dst)
            return
        assert p0 < 0 and p1 < 0, "a split KV copies whole sequences only"
        for cell in self.kv:
            cell.seqs.discard(dst)
        self.kv = [c for c in self.kv if c.seqs]
        self.kv += [FakeCell(c.pos, c.token, {dst}) for c in self.kv if src in c.seqs]

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
        for cell in self.kv:
            if seq_id in cell.seqs and p0 <= cell.pos < end:
                cell.seqs.discard(seq_id)
        self.kv = [c for c in self.kv if c.seqs]  # a cell no sequence holds is free

    def seq_shift(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.shifts.append((seq_id, p0, p1, delta))
        for cell in self.kv:
            if seq_id in cell.seqs and p0 <= cell.pos < p1:
                cell.pos += delta  # for every sequence holding it, as llama.cpp does

    can_shift = True

    def set_lora(self, scales: tuple[float, ...]) -> None:
        self.lora = scales

    def seq_state(self, seq_id: int) -> bytes:
        return json.dumps(self.cells[seq_id]).encode()

    def set_seq_state(self, seq_id: int, data: bytes, tokens: list[int]) -> bool:
        assert not self.cells[seq_id], "state restored into a sequence that is not empty"
        self.states_set += 1
        self.kv += [FakeCell(p, t, {seq_id}) for p, t in json.loads(data)]
        assert [t for _, t in sorted(json.loads(data))] == tokens, "the tokens given are not the state's"
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
        self.kv += [FakeCell(p, t, {seq_id}) for p, t in saved["cells"]]
        return len(data), saved["tokens"]

    def piece(self, token: int, *, special: bool = False) -> bytes:
        return self.pieces.get(token, f"<{token}>".encode())

    def is_eog(self, token: int) -> bool:
        return token == EOG
