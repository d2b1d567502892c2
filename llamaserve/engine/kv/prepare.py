"""A slot's KV cache between requests: what a new prompt can reuse, and the
context shift of a full slot.

`SlotKV.prepare` runs when the scheduler admits a request to a slot; `shift`
when a generation reaches the slot's end. Both act on the runner's KV
sequences and keep `Slot.cache_tokens` equal to what the sequence holds.
"""

from __future__ import annotations

import logging

from llamaserve.engine.kv.blocks import BLOCK, block_hashes
from llamaserve.engine.kv.host_cache import PromptCache
from llamaserve.engine.kv.policy import CachePolicy
from llamaserve.engine.kv.reuse import context_shift, pad_prefill, plan_chunk_reuse
from llamaserve.engine.kv.room import claimed_cells
from llamaserve.engine.kv.sharing import PrefixSharing, shareable
from llamaserve.engine.kv.slot import Slot, SlotState, common_prefix_length
from llamaserve.engine.runner import Runner
from llamaserve.engine.stats import SchedulerStats
from llamaserve.engine.types import GenerationRequest

log = logging.getLogger("llamaserve")


def losing_most(keep: int, held: int) -> bool:
    """Whether a new prompt that keeps ``keep`` of the ``held`` tokens a slot holds overwrites
    enough of it to copy the slot to the host cache first: more than half, llama-server's rule.

    llama.cpp serialises a whole sequence, so saving the slot copies all of it, not the part
    about to go: for a request that keeps most of a 5,400-token context (a conversation's next
    turn, another question on one document) that is a 124 MB copy on the scheduler thread, with
    every stream waiting, to keep a tail of a few dozen tokens, and one more near-duplicate of
    the conversation in host memory.
    """
    return 2 * keep < held


def sharing_off_reason(policy: CachePolicy, runner: Runner) -> str:
    """Why sequences do not share prompt prefixes' cells ("" when they do)."""
    if not policy.kv_unified:
        return "the KV cache is split per slot (--no-kv-unified)"
    if not policy.prefix_sharing:
        return "turned off (--no-prefix-sharing)"
    return runner.sharing_note if not runner.shares_cells else ""


class SlotKV:
    """Applies the cache policy (prefix, --cache-ram, --cache-reuse, --context-shift) to slots."""

    def __init__(self, runner: Runner, policy: CachePolicy, stats: SchedulerStats) -> None:
        self.runner = runner
        self.policy = policy
        self.stats = stats  # the scheduler's counters; replaced with them (see Scheduler.stats)
        self.prompt_cache = PromptCache(policy.cache_ram_bytes) if policy.cache_ram_bytes else None
        # Prompt prefixes shared across sequences: a unified KV whose cells seq_cp can share.
        self._prompt_hashes: tuple[list[int], list[int]] = ([], [])  # the last prompt prepare hashed
        self.sharing_note = sharing_off_reason(policy, runner)
        self.sharing = PrefixSharing(runner, not self.sharing_note)
        if self.sharing_note:
            log.info("prompt prefixes are not shared across slots: %s", self.sharing_note)

    @property
    def shifts_context(self) -> bool:
        return self.policy.context_shift and self.runner.can_shift

    def prepare(self, slot: Slot, req: GenerationRequest) -> tuple[int, int]:
        """Prepare slot's KV for req's prompt; returns how many prompt tokens are already in
        place, and how many of those are cells shared with another sequence.

        In order: the common prefix with what the slot holds; the longest prefix another
        sequence holds (shared, `sharing.py`) or a longer one from the host-memory cache;
        chunks further on moved into place (--cache-reuse). Whatever is left of the old
        content is removed.
        """
        prompt = req.prompt_tokens
        slot.kv_in_host_cache = False  # the sequence is about to change
        # Scoring the prompt needs the logits of every prompt position: nothing can be reused.
        reuse = req.cache_prompt and not req.prompt_logprobs
        # KV computed under other adapter scales is not this prompt's KV.
        same_lora = slot.cache_lora == req.lora
        keep = common_prefix_length(slot.cache_tokens, prompt) if reuse and same_lora else 0
        saved = restored = shared = 0
        if self.prompt_cache is not None and losing_most(keep, len(slot.cache_tokens)) and self._park(slot):
            saved = len(slot.cache_tokens)
        if not same_lora:
            self._truncate(slot, 0)
            slot.cache_lora = req.lora
        # The prompt's block hashes, kept for the slot: its KV will begin with this prompt. Those
        # of the part the slot holds already are known (KV cut next or parked keeps them).
        indexed = self.prompt_cache is not None or self.sharing.enabled
        own = self._chain(slot)[: keep // BLOCK] if same_lora else []
        prompt_hashes = block_hashes(prompt, req.lora, known=own) if indexed else []
        self._prompt_hashes = (prompt, prompt_hashes)  # begin_prefill's, right after
        found = self.sharing.find_held(prompt, prompt_hashes, req.lora, slot, beat=keep) if reuse else (None, 0)
        lender, n_live = found
        n_live = shareable(prompt, n_live)
        if reuse and self.prompt_cache is not None:
            entry, n = self.prompt_cache.best(prompt, req.lora, prompt_hashes, beat=max(keep, n_live))
            # A restore copies a whole state into new cells; sharing copies nothing, so it wins a tie.
            if entry is not None and n > keep and shareable(prompt, n) > n_live:
                self._truncate(slot, 0)
                if self.runner.set_seq_state(slot.id, entry.state, entry.tokens):
                    slot.cache_tokens = list(entry.tokens)
                    keep = restored = n
                    self.stats.prompt_cache_hits += 1
                else:  # a state that no longer fits (e.g. unified KV is full): start clean
                    self.runner.seq_remove(slot.id, 0, -1)
        if lender is not None and n_live > keep:
            self.sharing.share(lender, slot, n_live)
            keep = shared = n_live
        if saved or restored:
            # llama-server's words for a slot exchanging KV with the host cache (its tests grep them).
            log.debug("slot %d: updating prompt cache: saved %d tokens, restored %d", slot.id, saved, restored)
        if shared:
            log.debug(
                "slot %d: sharing %d prompt tokens' cells of slot %d", slot.id, shared, lender.id if lender else -1
            )
        min_chunk = req.n_cache_reuse if req.n_cache_reuse >= 0 else self.policy.cache_reuse
        # Moving cells that another sequence holds too would move them for it as well: then
        # the rest is decoded again instead.
        movable = not self.sharing.shared_past(slot, keep)
        if reuse and min_chunk > 0 and keep < len(slot.cache_tokens) and self.runner.can_shift and movable:
            keep = self._move_chunks(slot, prompt, keep, min_chunk)
        keep = min(keep, len(prompt) - 1)  # the last prompt token is decoded again for its logits
        padded = pad_prefill(keep, len(prompt), self.policy.prefill_tile_rows)
        # Never part of a media again: its rows belong together (full attention among them,
        # or one shared position with M-RoPE), so only text is decoded twice.
        if not any(token < 0 for token in prompt[padded:keep]):
            keep = padded
        self._truncate(slot, keep)
        slot.cache_hashes = prompt_hashes[: keep // BLOCK]  # the slot now holds prompt[:keep]
        self.sharing.note(slot, known=prompt_hashes)
        return keep, min(shared, keep)

    def begin_prefill(self, slot: Slot) -> None:
        """The request bound to slot starts its prefill, or, when a prefill in progress will
        write a longer prefix of its prompt than it holds, waits for that (SlotState.JOINING)."""
        task = slot.task
        if not self.sharing.enabled or task is None:
            return
        req = task.request
        prompt, hashes = self._prompt_hashes
        if prompt is not req.prompt_tokens:
            hashes = block_hashes(slot.prompt, req.lora)
        join = (
            self.sharing.plan_join(slot, hashes, slot.n_past) if req.cache_prompt and not req.prompt_logprobs else None
        )
        if join is not None:
            slot.joining = join
            slot.state = SlotState.JOINING
            log.debug(
                "slot %d: waiting for slot %d to write %d prompt tokens to share", slot.id, join.leader.id, join.n
            )
        else:
            self.sharing.prefilling(slot, hashes)

    def finish_join(self, slot: Slot) -> None:
        """A joining request whose leader wrote its prefix (or stopped): share what there is,
        then prefill the rest of the prompt."""
        assert slot.task is not None
        before = slot.n_past
        n = self.sharing.finish_join(slot)
        if n > before:  # a new share: its cells replaced what the slot held
            self.stats.prompt_tokens_shared_total += n - slot.n_shared
            self.stats.prompt_tokens_cached_total += n - slot.n_cached
            slot.n_shared = slot.n_cached = n
        slot.state = SlotState.PREFILL
        # The slot holds a prefix of its prompt now: only the rest of the prompt is hashed.
        hashes = block_hashes(slot.prompt, slot.task.request.lora, known=self.sharing.held_chain(slot))
        self.sharing.prefilling(slot, hashes)

    def park_idle(self, slots: list[Slot]) -> None:
        """--cache-idle-slots: keep idle slots' KV in host memory only, as llama-server does.

        llama.cpp's attention covers every used cell of a unified KV, so a long idle conversation
        slows every other request and can fill the cache; parked, it comes back from the host
        cache when its conversation returns. Without a unified KV clearing frees nothing another
        slot could use, so only the copy is made.
        """
        if not self.policy.cache_idle_slots or self.prompt_cache is None:
            return
        for slot in slots:
            if slot.busy or not slot.cache_tokens or slot.kv_in_host_cache:
                continue  # an idle slot's KV does not change, so one copy is enough
            self._park(slot)
            # The tag is llama-server's: its test suite reads the log to see the slot parked.
            log.debug("slot %d: saving idle slot to prompt cache __TEST_TAG_CACHE_IDLE_SLOT__", slot.id)
            if self.policy.kv_unified:
                self._truncate(slot, 0)
                self.stats.idle_slots_cleared += 1

    def free_idle_cells(self, slots: list[Slot], n_cells: int) -> None:
        """A unified pool: clear idle slots' KV, least recently used first, until what the busy
        slots claim (engine/kv/room.py) and what idle slots still hold fit the pool. Without
        this, idle conversations left in the pool (no host cache to park them in) would fill it."""
        if not self.policy.kv_unified:
            return
        held = sum(s.n_past for s in slots if not s.busy)
        if not held:
            return  # the usual case: --cache-idle-slots already parked and cleared them
        over = claimed_cells(slots) + held - n_cells
        for slot in sorted((s for s in slots if not s.busy and s.cache_tokens), key=lambda s: s.last_used):
            if over <= 0:
                return
            over -= slot.n_past
            log.debug("slot %d: idle KV cleared to make room in the unified pool", slot.id)
            self._truncate(slot, 0)

    def _truncate(self, slot: Slot, keep: int) -> None:
        if keep < len(slot.cache_tokens):
            self.runner.seq_remove(slot.id, keep, -1)
            del slot.cache_tokens[keep:]
            del slot.cache_hashes[keep // BLOCK :]
            self.sharing.cut(slot, keep)

    def _park(self, slot: Slot) -> bool:
        """Copy the slot's KV to the host-memory cache before it is overwritten; True: copied."""
        assert self.prompt_cache is not None
        tokens = slot.cache_tokens
        if not tokens:
            return False
        hashes = block_hashes(tokens, slot.cache_lora, known=self._chain(slot))
        if self.prompt_cache.covers(tokens, slot.cache_lora, hashes):
            slot.kv_in_host_cache = True
            return False
        if self.prompt_cache.put(tokens, self.runner.seq_state(slot.id), slot.cache_lora, hashes):
            slot.kv_in_host_cache = True
            self.stats.prompt_cache_saves += 1
            return True
        return False

    def _chain(self, slot: Slot) -> list[int]:
        """Chain hashes of a leading run of the slot's whole blocks, under its scales: all of
        them from the sharing index when it is on, else those prepare kept (`cache_hashes`)."""
        return self.sharing.held_chain(slot) or slot.cache_hashes

    def _move_chunks(self, slot: Slot, prompt: list[int], keep: int, min_chunk: int) -> int:
        moves, in_place = plan_chunk_reuse(slot.cache_tokens, prompt, keep, min_chunk)
        if not moves:
            return keep
        for m in moves:
            # Drop the cells between the chunk's new and old place, then slide it back.
            self.runner.seq_remove(slot.id, m.dst, m.src)
            self.runner.seq_shift(slot.id, m.src, m.src + m.length, m.dst - m.src)
        self.runner.seq_remove(slot.id, in_place, -1)
        slot.cache_tokens = list(prompt[:in_place])
        self.sharing.cut(slot, keep)  # the cells after keep moved: nothing there is shared
        self.stats.cache_reuse_tokens += sum(m.length for m in moves)
        return in_place

    def shift(self, slot: Slot) -> bool:
        """The slot is full: drop half of what follows the kept prefix and slide the rest back.

        Cells that another sequence shares would slide for it too: a slot sharing any past the
        kept prefix first gets cells of its own (`PrefixSharing.detach`). False: there was no
        room for that copy, the slot's cells are gone and its request must end.
        """
        assert slot.task is not None
        n_keep = slot.task.request.n_keep
        if n_keep < 0:
            n_keep = len(slot.prompt)
        start, n_discard = context_shift(slot.n_past, n_keep, slot.task.request.n_discard)
        if self.sharing.shared_past(slot, start):
            log.debug("slot %d: cells shared past position %d: copied into cells of its own", slot.id, start)
            if not self.sharing.detach(slot):
                return False
        self.runner.seq_remove(slot.id, start, start + n_discard)
        self.runner.seq_shift(slot.id, start + n_discard, slot.n_past, -n_discard)
        del slot.cache_tokens[start : start + n_discard]
        del slot.cache_hashes[start // BLOCK :]  # blocks from the cut on hold other tokens now
        self.sharing.cut(slot, start)
        slot.truncated = True
        self.stats.context_shifts += 1
        return True
