"""Prompt prefixes shared across sequences of a unified KV cache.

Within one unified KV cache llama.cpp lets several sequences hold the same cells:
`llama_memory_seq_cp(src, dst, p0, p1)` tags the cells src holds at positions [p0, p1) with
dst and copies nothing, attention masks by sequence, and a cell is freed once no sequence
holds it. So a request whose prompt begins with what another sequence holds (busy or idle)
gets those cells tagged with its own sequence and decodes only the rest; and requests that
arrive together with the same uncached prefix compute it once: the first one's prefill
writes it while the others wait (`SlotState.JOINING`), then they share it.

Two block indexes (chain hashes of 256-token blocks, `blocks.py`) find the longest prefix
in time independent of the number of slots: one over the cells each sequence holds now, one
over the prompts prefills are writing. A candidate is always compared token by token before
its cells are shared, so a stale index entry can cost a share, never give wrong KV.

Sharing changes what may edit a sequence's cells. Removing them (`seq_rm`) only untags
them; moving them (`seq_add`: a context shift, `--cache-reuse`) moves a shared cell for
every sequence holding it. Each slot keeps its peers, the sequences that may hold some of
its cells and below which position (conservatively); before cells are moved, a sequence
with peers in the range is detached: its state copied out and read back into new cells
(`detach`). Counting: a slot's `lent` prefix is counted once, in its lender, while the
lender has cut nothing since (`distinct_cells`, the KV room in `room.py`).

Sharing needs `Runner.shares_cells`: off with a split KV, a sliding-window cache or a
recurrent state, where the scheduler keeps each sequence's cells to itself as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llamaserve.engine.backend import media_slot
from llamaserve.engine.kv.blocks import BLOCK, PrefixIndex, more_block_hashes
from llamaserve.engine.kv.slot import Join, Lent, Slot, SlotState, common_prefix_length
from llamaserve.engine.runner import Runner


@dataclass
class _Indexed:
    """What the held index has for one slot: the chain of its cells' first ``end // BLOCK``
    whole blocks, hashed when the slot's kv_version and LoRA scales were these."""

    version: int
    lora: tuple[float, ...]
    end: int


def media_safe(prompt: list[int], n: int) -> int:
    """n, moved back to the start of a media item that position n would cut in two: the
    rest of an image cannot be decoded alone (its rows attend to each other in one decode)."""
    while 0 < n < len(prompt) and prompt[n] < 0 and prompt[n - 1] < 0:
        if media_slot(prompt[n])[0] != media_slot(prompt[n - 1])[0]:
            break
        n -= 1
    return n


def shareable(prompt: list[int], n: int) -> int:
    """How many of n shared leading prompt tokens a sequence may take: never the last prompt
    token (its logits are needed) and never part of a media item."""
    return media_safe(prompt, min(n, len(prompt) - 1))


class PrefixSharing:
    """The prefix indexes over a scheduler's slots and the cell sharing between them."""

    def __init__(self, runner: Runner, enabled: bool) -> None:
        self.runner = runner
        self.enabled = enabled
        self._slots: dict[int, Slot] = {}
        self._held = PrefixIndex()  # slot id -> chain of the cells it holds
        self._held_at: dict[int, _Indexed] = {}
        self._coming = PrefixIndex()  # slot id -> chain of the prompt its prefill writes

    def register(self, slots: Iterable[Slot]) -> None:
        for slot in slots:
            self._slots[slot.id] = slot

    # ------------------------------------------------------------ the indexes
    def note(self, slot: Slot, known: list[int] | None = None) -> None:
        """The slot's cells changed: index its whole blocks. A sequence that grew costs only
        the blocks it completed, and one that was cut (`cut`) only those it lost, so a step
        that completes no block costs a comparison. ``known``: a chain the slot's cells are
        known to begin with (under its scales), such as its lender's: those blocks are not hashed."""
        if not self.enabled:
            return
        tokens = slot.cache_tokens
        cur = self._held_at.get(slot.id)
        if cur is None or cur.version != slot.kv_version or cur.lora != slot.cache_lora or len(tokens) < cur.end:
            hashes = list(known[: len(tokens) // BLOCK]) if known else []
            hashes += more_block_hashes(tokens, slot.cache_lora, hashes)
            self._held.add(slot.id, hashes)
            self._held_at[slot.id] = _Indexed(slot.kv_version, slot.cache_lora, len(hashes) * BLOCK)
            return
        if len(tokens) < cur.end + BLOCK:
            return  # the usual step: no block completed
        chain = self._held.chain(slot.id)
        n_have, n_blocks = len(chain), len(tokens) // BLOCK
        more = list(known[n_have:n_blocks]) if known and len(known) > n_have else []
        more += more_block_hashes(tokens, slot.cache_lora, chain + more if more else chain)
        self._held.extend(slot.id, more)
        cur.end = n_blocks * BLOCK

    def held_chain(self, slot: Slot) -> list[int]:
        """The chain of the slot's whole blocks as the held index has it (not to be edited), or
        [] when the index is off or has not seen the slot's latest cells."""
        cur = self._held_at.get(slot.id)
        if (
            not self.enabled
            or cur is None
            or cur.version != slot.kv_version
            or cur.lora != slot.cache_lora
            or cur.end != len(slot.cache_tokens) // BLOCK * BLOCK
        ):
            return []
        return self._held.chain(slot.id)

    def prefilling(self, slot: Slot, hashes: list[int]) -> None:
        """The slot's prefill will write its prompt (``hashes``: its chain under the request's
        scales): requests arriving meanwhile may wait for it instead of computing the same."""
        if self.enabled and hashes:
            self._coming.add(slot.id, hashes)

    def prefilled(self, slot: Slot) -> None:
        """The slot's prefill ended (done, aborted or failed)."""
        self._coming.remove(slot.id)

    def find_held(
        self, prompt: list[int], hashes: list[int], lora: tuple[float, ...], exclude: Slot, beat: int = 0
    ) -> tuple[Slot | None, int]:
        """The sequence holding the longest prefix of ``prompt`` (whole blocks at least) under
        the same adapter scales, and that length; (None, 0) when none does, or none holds
        more than ``beat`` tokens of it (what the caller has without it)."""
        return self._longest(self._held, prompt, hashes, lora, exclude, beat, coming=False)

    def find_coming(
        self, prompt: list[int], hashes: list[int], lora: tuple[float, ...], exclude: Slot, beat: int = 0
    ) -> tuple[Slot | None, int]:
        """The prefill whose prompt shares the longest prefix with ``prompt`` (more than ``beat``
        tokens), and that length."""
        return self._longest(self._coming, prompt, hashes, lora, exclude, beat, coming=True)

    def _longest(
        self,
        index: PrefixIndex,
        prompt: list[int],
        hashes: list[int],
        lora: tuple[float, ...],
        exclude: Slot,
        beat: int,
        *,
        coming: bool,
    ) -> tuple[Slot | None, int]:
        if not self.enabled or not hashes:
            return None, 0
        # Every key at the longest shared level shares that many blocks by hash: the tokens after
        # them are compared for each, the blocks themselves only for the longest (which catches
        # a stale entry or a hash collision: then the next one, then the next level down).
        for level in range(index.longest_shared(hashes), 0, -1):
            start = level * BLOCK
            if start + BLOCK - 1 <= beat:
                break  # a sequence first found here shares less than a block more than this level
            found: list[tuple[int, int]] = []
            for key in index.sharing(hashes, level):
                tokens = self._tokens(self._slots[key], lora, exclude, coming)
                if tokens is not None:
                    found.append((common_prefix_length(tokens, prompt, start), key))
            found.sort(key=lambda f: (-f[0], f[1]))
            for n, key in found:
                slot = self._slots[key]
                tokens = self._tokens(slot, lora, exclude, coming)
                if n <= beat:
                    break
                if tokens is not None and tokens[:start] == prompt[:start]:
                    return slot, n
        return None, 0

    @staticmethod
    def _tokens(slot: Slot, lora: tuple[float, ...], exclude: Slot, coming: bool) -> list[int] | None:
        """What a candidate of `_longest` offers: the prompt its prefill writes, or the tokens its
        cells hold; None when it offers nothing under these adapter scales."""
        if slot is exclude:
            return None
        if coming:
            usable = slot.state is SlotState.PREFILL and slot.task is not None and slot.task.request.lora == lora
            return slot.prompt if usable else None
        return slot.cache_tokens if slot.cache_lora == lora else None

    # ------------------------------------------------------------ sharing cells
    def share(self, lender: Slot, slot: Slot, n: int) -> None:
        """Give ``slot`` (whatever it held is removed) the lender's first n cells, tagged."""
        self.runner.seq_remove(slot.id, 0, -1)
        slot.cache_tokens = []
        self.cut(slot, 0)
        self.runner.seq_copy(lender.id, slot.id, 0, n)
        slot.cache_tokens = lender.cache_tokens[:n]
        slot.cache_lora = lender.cache_lora
        slot.cache_hashes = []
        slot.lent = Lent(lender, lender.kv_epoch, n)
        self.link(lender, slot, n)
        self.note(slot, known=self.held_chain(lender))

    def link(self, lender: Slot, slot: Slot, n: int) -> None:
        """``slot`` now holds the lender's cells below n: it and the lender become peers, and so
        do it and every peer of the lender holding some of those cells."""
        pairs = [(lender.id, n), *((pid, min(bound, n)) for pid, bound in lender.peers.items())]
        for pid, bound in pairs:
            if pid == slot.id or bound <= 0:
                continue
            other = self._slots[pid]
            slot.peers[pid] = max(slot.peers.get(pid, 0), bound)
            other.peers[slot.id] = max(other.peers.get(slot.id, 0), bound)

    def cut(self, slot: Slot, keep: int) -> None:
        """The slot's cells from position ``keep`` on were removed (and its cache_tokens cut to
        match): it shares nothing there now. Every removal goes through here: a new kv_version
        tells the index that the sequence changed, and a new kv_epoch, when the cut reached
        cells a peer may hold, tells its borrowers that those cells may be theirs alone now."""
        slot.kv_version += 1
        if self.shared_past(slot, keep):
            slot.kv_epoch += 1
        cur = self._held_at.get(slot.id)
        if cur is not None and self.enabled:  # the blocks before the cut still hold what they held
            cur.end = min(cur.end, keep // BLOCK * BLOCK)
            cur.version = slot.kv_version
            self._held.truncate(slot.id, cur.end // BLOCK)
        if slot.lent is not None:
            slot.lent.n = min(slot.lent.n, keep)
            if slot.lent.n <= 0:
                slot.lent = None
        for pid, bound in list(slot.peers.items()):
            other = self._slots[pid]
            if min(bound, keep) <= 0:
                del slot.peers[pid]
                other.peers.pop(slot.id, None)
            else:
                slot.peers[pid] = min(bound, keep)
                other.peers[slot.id] = min(other.peers.get(slot.id, keep), keep)
        self.note(slot)

    def shared_past(self, slot: Slot, pos: int) -> bool:
        """Whether another sequence may hold some of the slot's cells at or after ``pos``."""
        return any(bound > pos for bound in slot.peers.values())

    def detach(self, slot: Slot) -> bool:
        """Make the slot's cells its own (copied out and read back into new cells), so that they
        can be moved without moving another sequence's. False: the copy found no room and the
        slot's cells are gone (its cache is cleared)."""
        state = self.runner.seq_state(slot.id)
        tokens = list(slot.cache_tokens)
        self.runner.seq_remove(slot.id, 0, -1)
        self.cut(slot, 0)
        if self.runner.set_seq_state(slot.id, state, tokens):
            return True
        self.runner.seq_remove(slot.id, 0, -1)
        slot.cache_tokens.clear()
        slot.cache_hashes.clear()
        self.note(slot)
        return False

    # ------------------------------------------------------------ waiting for a prefill
    def plan_join(self, slot: Slot, hashes: list[int], keep: int) -> Join | None:
        """Whether the request just bound to ``slot`` should wait for a prefill in progress that
        will write a longer prefix of its prompt than the ``keep`` tokens it has: worth it from
        one block more on (the leader computes them once instead of each request again)."""
        task = slot.task
        if task is None or not self.enabled:
            return None
        leader, n = self.find_coming(slot.prompt, hashes, task.request.lora, slot, beat=keep + BLOCK - 1)
        n = shareable(slot.prompt, n)
        if leader is None or leader.task is None or n - keep < BLOCK or n <= leader.n_past:
            return None
        return Join(leader, leader.task.id, n)

    def join_ready(self, slot: Slot) -> bool:
        """The leader wrote the prefix, or will not (it finished, failed or was aborted)."""
        join = slot.joining
        if join is None:
            return True
        leader = join.leader
        task = leader.task
        return (
            task is None or task.id != join.task_id or leader.state is not SlotState.PREFILL or leader.n_past >= join.n
        )

    def finish_join(self, slot: Slot) -> int:
        """Share what the leader holds of the slot's prompt (up to the join's length); returns
        how many prompt tokens the slot now holds."""
        join = slot.joining
        assert join is not None and slot.task is not None
        slot.joining = None
        leader = join.leader
        n = 0
        if leader.cache_lora == slot.task.request.lora:
            n = shareable(slot.prompt, min(join.n, common_prefix_length(leader.cache_tokens, slot.prompt)))
        if n > slot.n_past:
            self.share(leader, slot, n)
        return slot.n_past

    # ------------------------------------------------------------ counting
    def distinct_cells(self, slots: Iterable[Slot]) -> int:
        """The cells the sequences hold, a shared one counted once (in its lender)."""
        total = 0
        for slot in slots:
            total += slot.n_past
            lent = slot.lent
            if lent is not None and lent.holds():
                total -= min(lent.n, slot.n_past)
        return total


def lent_cells(slot: Slot) -> int:
    """Of the cells the slot's request claims, those a busy lender holds (or its prefill will
    write, for a joining request) too: the KV room counts them there."""
    n = 0
    lent = slot.lent
    if lent is not None and lent.holds() and lent.lender.busy:
        n = lent.n
    join = slot.joining
    if join is not None and join.leader.busy:
        n = max(n, join.n)
    return n
