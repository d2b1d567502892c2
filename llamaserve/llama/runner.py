"""`LlamaRunner`: the engine's runner seam (engine/runner.py) on a real llama.cpp context."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from llamaserve.engine.runner import PlanRow, Sample, Sampler, SeqState, StepResult, verify_draft
from llamaserve.engine.sampling import SamplingParams
from llamaserve.engine.types import TokenLogprob
from llamaserve.llama.context import Context
from llamaserve.llama.logprobs import token_logprob
from llamaserve.llama.lora import LoraAdapter, apply_scales
from llamaserve.llama.media import MediaStore
from llamaserve.llama.model import Model
from llamaserve.llama.positions import MediaPositions
from llamaserve.llama.sampler import SamplerChain


def split_decode_rows(plan: list[PlanRow], tile_rows: int) -> tuple[list[int], list[int]] | None:
    """The plan's single-token rows and its other rows, by index, when they are better decoded
    apart; None (the usual step) when the plan goes to llama.cpp as one batch.

    ggml's CPU flash attention computes a micro-batch of ``tile_rows`` rows or more as tiles
    of consecutive rows against tiles of KV cells, skipping a KV tile only when every row
    of the query tile is masked from it. Single-token rows of many sequences (the decoding
    slots) share query tiles, so together with a prompt chunk they are scored against the
    whole KV cache instead of their own cells. Decoded apart, the decode rows take the
    row-by-row path and the prompt chunk its own tiles: at 16 slots of ~120 tokens and a
    48-token prompt, 76 + 171 ms apart against 350 ms together; at 32 slots and 300
    tokens, 168 + 1,299 against 1,669 (SmolLM2-135M, 2 threads).
    """
    # Called every step: a decode-only step of fewer rows than a tile returns here.
    if not tile_rows or len(plan) < 2 or sum(len(row.tokens) for row in plan) < tile_rows:
        return None
    single = [i for i, row in enumerate(plan) if len(row.tokens) == 1]
    if len(single) < 2 or len(single) == len(plan):
        return None
    return single, [i for i, row in enumerate(plan) if len(row.tokens) > 1]


class LlamaRunner:
    """Runs plans on a real llama.cpp context."""

    def __init__(
        self,
        model: Model,
        context: Context,
        adapters: list[LoraAdapter] | None = None,
        *,
        special: bool = False,
        media: MediaStore | None = None,
        mrope: bool = False,
        attention_tile_rows: int = 0,
    ) -> None:
        self.model = model
        # -sp/--special: control tokens (<|im_end|>, ...) are written into the generated text.
        self.special = special
        self.context = context
        self.adapters = adapters or []
        self._lora: tuple[float, ...] = ()
        self.n_ctx_seq = context.n_ctx_seq
        self.n_batch = context.n_batch
        self.n_ubatch = min(context.settings.n_ubatch, context.n_batch)
        self.n_seq_max = context.settings.n_seq_max
        # Encoded media that prompt placeholders (negative tokens) name; None without --mmproj.
        self.media = media
        # M-RoPE projectors: media take fewer positions than cells, so the engine's cell numbers
        # are turned into model positions here (llama/positions.py); None: they are the same.
        self.positions = MediaPositions() if mrope and media is not None else None
        # ggml's CPU flash-attention tile (llama/context.cpu_flash_attention_tile); 0: none.
        self.attention_tile_rows = attention_tile_rows
        self._meanwhile: Callable[[], None] | None = None  # the step's `meanwhile`, until called

    def new_sampler(self, params: SamplingParams) -> SamplerChain:
        return SamplerChain(self.model, params)

    def _decode_media(self, plan: list[PlanRow]) -> tuple[list[PlanRow], str | None, int, dict[int, str]]:
        """Decode the plan's media rows; returns the text rows that are left.

        The scheduler plans a slot's chunk as all text or all media, so within one
        sequence nothing depends on the order of the two batches (llama.cpp's batch is
        tokens or embeddings, not both). Media go first, so the sampled logits are the
        text batch's; a media chunk never samples, as a prompt never ends in media
        (projectors close each with text).
        """
        if self.media is None or all(row.tokens[0] >= 0 for row in plan if row.tokens):
            return plan, None, 0, {}
        rows: list[tuple[np.ndarray, int, int]] = []
        sections: list[np.ndarray] = []
        non_causal = False
        text: list[PlanRow] = []
        failed: dict[int, str] = {}
        for index, row in enumerate(plan):
            if not row.tokens or row.tokens[0] >= 0:
                text.append(row)
                continue
            if row.samplers or row.targets is not None:
                failed[index] = "a prompt cannot end with media, nor ask for prompt log-probabilities with media"
                continue
            found = [self.media.entry(tok) if tok < 0 else None for tok in row.tokens]
            if any(f is None for f in found):
                failed[index] = "an image or audio of this prompt is no longer in the media store; send it again"
                continue
            for i, (entry, k) in enumerate(f for f in found if f is not None):
                cell = row.start_pos + i
                rows.append((entry.embeddings[k], cell, row.seq_id))
                non_causal = non_causal or entry.non_causal
                if self.positions is not None:
                    if k == 0:
                        self.positions.note(row.seq_id, cell, len(entry.embeddings), entry.n_pos)
                    sections.append(entry.positions(k, self.positions.position(row.seq_id, cell - k)))
        if rows:
            code = self.context.decode_embd(
                rows, non_causal=non_causal, sections=np.stack(sections) if sections else None
            )
            if code != 0:
                return plan, f"llama_decode failed with code {code} (media)", code, {}
        return text, None, 0, failed

    def step(self, plan: list[PlanRow], meanwhile: Callable[[], None] | None = None) -> StepResult:
        # Called right after the first llama_decode, before the sampling waits for its logits:
        # on a GPU the decode runs on while the scheduler does its bookkeeping; on a CPU the
        # decode has finished by then, and the order changes nothing.
        self._meanwhile = meanwhile
        try:
            return self._step(plan)
        finally:
            self._run_meanwhile()

    def _run_meanwhile(self) -> None:
        meanwhile, self._meanwhile = self._meanwhile, None
        if meanwhile is not None:
            meanwhile()

    def _step(self, plan: list[PlanRow]) -> StepResult:
        text, media_error, media_code, failed = self._decode_media(plan)
        if media_error is not None:
            return StepResult([[] for _ in plan], error=media_error, no_space=media_code == 1)
        if len(text) == len(plan):
            return self._step_text(plan)
        # Media rows sample nothing: their results are empty, in the plan's order.
        result = self._step_text(text)
        by_row = dict(zip(map(id, text), result.samples))
        samples = [by_row.get(id(row), []) for row in plan]
        lps = dict(zip(map(id, text), result.prompt_logprobs))
        prompt_lps = [lps.get(id(row), []) for row in plan] if result.prompt_logprobs else []
        return StepResult(
            samples, error=result.error, no_space=result.no_space, prompt_logprobs=prompt_lps, failed_rows=failed
        )

    def _step_text(self, plan: list[PlanRow]) -> StepResult:
        split = split_decode_rows(plan, self.attention_tile_rows)
        if split is None:
            return self._decode_and_sample(plan)
        samples: list[list[Sample]] = [[] for _ in plan]
        prompt_lps: list[list[TokenLogprob]] = [[] for _ in plan]
        for group in split:
            # Each decode overwrites the logits: a group is sampled before the next one runs.
            result = self._decode_and_sample([plan[i] for i in group])
            if result.error is not None:
                return StepResult([[] for _ in plan], error=result.error, no_space=result.no_space)
            for i, row_samples in zip(group, result.samples):
                samples[i] = row_samples
            for i, scored in zip(group, result.prompt_logprobs):
                prompt_lps[i] = scored
        scoring = any(row.targets for row in plan)
        return StepResult(samples, prompt_logprobs=prompt_lps if scoring else [])

    def _decode_and_sample(self, plan: list[PlanRow]) -> StepResult:
        if not plan:
            return StepResult([])
        rows: list[tuple[int, int, int, bool]] = []
        sample_at: list[int] = []
        for row in plan:
            last = len(row.tokens) - 1
            wants = bool(row.samplers)
            every = row.targets is not None or bool(row.draft)
            start = row.start_pos
            if self.positions is not None:
                self.positions.forget(row.seq_id, start)
                start = self.positions.position(row.seq_id, start)
            for i, tok in enumerate(row.tokens):
                rows.append((tok, start + i, row.seq_id, every or (wants and i == last)))
            sample_at.append(len(rows) - 1)
        code = self.context.decode(rows)
        if code != 0:
            return StepResult([[] for _ in plan], error=f"llama_decode failed with code {code}", no_space=code == 1)
        self._run_meanwhile()
        ctx = self.context.handle
        n_vocab = self.model.n_vocab
        samples: list[list[Sample]] = []
        for row, index in zip(plan, sample_at):
            if row.draft and row.samplers:
                samples.append(self._verify(row, index - len(row.draft)))
                continue
            samples.append([self._sample(sampler, row, index) for sampler in row.samplers])
        prompt_lps: list[list[TokenLogprob]] = []
        if not any(row.targets for row in plan):  # the usual step: no prompt scoring
            return StepResult(samples)
        for row, last_index in zip(plan, sample_at):
            first = last_index - len(row.tokens) + 1
            k = max(row.n_probs, 0)
            prompt_lps.append(
                [token_logprob(ctx, first + i, n_vocab, target, k) for i, target in enumerate(row.targets or [])]
            )
        return StepResult(samples, prompt_logprobs=prompt_lps)

    def _verify(self, row: PlanRow, first: int) -> list[Sample]:
        """A draft row: its logits start at batch index ``first``."""
        sampler = row.samplers[0]
        return verify_draft(row, lambda i: self._sample(sampler, row, first + i), self.model.is_eog)

    def _sample(self, sampler: Sampler, row: PlanRow, index: int) -> Sample:
        ctx = self.context.handle
        if row.n_probs >= 0 and row.post_sampling:
            token, post = sampler.sample_post(ctx, index, row.n_probs)
            return Sample(token, post)
        token = sampler.sample(ctx, index)
        lp = token_logprob(ctx, index, self.model.n_vocab, token, row.n_probs) if row.n_probs >= 0 else None
        return Sample(token, lp)

    def seq_copy(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        # With M-RoPE only whole sequences are copied (n > 1 choices): shares_cells is off.
        self.context.seq_copy(src, dst, p0, p1)
        if self.positions is not None:
            self.positions.copy(src, dst)

    @property
    def shares_cells(self) -> bool:
        return not self.sharing_note

    @property
    def sharing_note(self) -> str:
        if self.positions is not None:
            return "an M-RoPE projector places media at fewer positions than cells"
        return self.context.sharing_note

    def set_lora(self, scales: tuple[float, ...]) -> None:
        """Switch adapter scales only when they change: a switch rebuilds llama.cpp's graph."""
        if scales != self._lora:
            apply_scales(self.context, self.adapters, scales)
            self._lora = scales

    def seq_remove(self, seq_id: int, p0: int, p1: int = -1) -> None:
        if self.positions is not None:
            at = self.positions.position
            p0, p1, cell = at(seq_id, p0), (at(seq_id, p1) if p1 >= 0 else p1), p0
            if p1 < 0:
                self.positions.forget(seq_id, cell)
        self.context.seq_remove(seq_id, p0, p1)

    def seq_shift(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.context.seq_shift(seq_id, p0, p1, delta)

    @property
    def can_shift(self) -> bool:
        # M-RoPE: a cell's position depends on the media before it; cells are not slid around.
        return self.context.can_shift and self.positions is None

    def seq_state(self, seq_id: int) -> bytearray:
        return self.context.seq_state(seq_id)

    def set_seq_state(self, seq_id: int, data: SeqState, tokens: list[int]) -> bool:
        done = self.context.set_seq_state(seq_id, data)
        if done and self.positions is not None and self.media is not None:
            self.positions.rebuild(seq_id, tokens, self.media.shape)
        return done

    def save_seq_file(self, path: str, seq_id: int, tokens: list[int]) -> int:
        return self.context.save_seq_file(path, seq_id, tokens)

    def load_seq_file(self, path: str, seq_id: int) -> tuple[int, list[int]]:
        n_read, tokens = self.context.load_seq_file(path, seq_id, self.n_ctx_seq)
        if self.positions is not None and self.media is not None:
            # Media of a file are dropped by the engine (engine/kv/files.py); the text before them counts.
            self.positions.rebuild(seq_id, tokens, self.media.shape)
        return n_read, tokens

    def piece(self, token: int, *, special: bool = False) -> bytes:
        return self.model.piece(token, special=self.special or special)

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)
