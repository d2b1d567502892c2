"""The scheduler: one thread that owns the runner and does continuous batching.

Every step it (1) takes messages from its inbox, (2) places waiting requests
in free slots, reusing each slot's cached prefix, (3) builds one plan holding
the next token of every generating slot plus prompt chunks of slots still in
prefill, within one micro-batch (n_ubatch tokens), (4) runs it, and (5) turns sampled tokens into
text events for each request. Requests join and leave between steps.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

from llamaserve.engine.admission import AdmissionControl, QueueFull, QueueLimits
from llamaserve.engine.inbox import Abort, Call, Message, Shutdown, Submit
from llamaserve.engine.kv.assign import bind_task, choose_slot
from llamaserve.engine.kv.policy import CachePolicy
from llamaserve.engine.kv.prepare import SlotKV
from llamaserve.engine.kv.room import KVRoom
from llamaserve.engine.kv.slot import Lent, Slot, SlotState, Task
from llamaserve.engine.later_text import LaterText
from llamaserve.engine.outbox import Outbox, deliver, events_for
from llamaserve.engine.runner import PlanRow, Runner, Sample
from llamaserve.engine.slot_reports import finished_event, progress_event
from llamaserve.engine.speculative import Speculator, apply_verified
from llamaserve.engine.stats import SchedulerStats
from llamaserve.engine.step_budget import PrefillBudget
from llamaserve.engine.step_plan import adapter_sets, decode_rows_beside_prefill, plan_generating, plan_prefill
from llamaserve.engine.token_outcome import goes_on_whatever_its_text, take_token, take_token_early
from llamaserve.engine.types import (
    EventSink,
    Failed,
    Finished,
    GenerationRequest,
)

log = logging.getLogger("llamaserve.scheduler")

CONTEXT_EXCEEDED = "Context size has been exceeded."


class Scheduler:
    """Continuous-batching scheduler over `n_slots` KV sequences."""

    def __init__(
        self,
        runner: Runner,
        n_slots: int,
        *,
        slot_prompt_similarity: float = 0.1,
        cache: CachePolicy | None = None,
        n_ctx_slot: int = 0,
        cont_batching: bool = True,
        show_special: bool = False,
        queue_limits: QueueLimits | None = None,
        max_itl_ms: int = 0,
        speculator: Speculator | None = None,
    ) -> None:
        self.runner = runner
        self.spec = speculator  # speculative decoding (--spec-type), None when off
        # A slot's context: the KV sequence's, or less (--kv-unified-per-slot caps it).
        self._n_ctx_slot = min(n_ctx_slot, runner.n_ctx_seq) if n_ctx_slot > 0 else runner.n_ctx_seq
        self.slots = [Slot(i, self._n_ctx_slot) for i in range(n_slots)]
        # The busy slots in slot order, kept by _count_busy: each step's planning walks these,
        # not every slot (-np auto makes 32, and one stream should not pay for 31 idle ones).
        self._busy: list[Slot] = []
        # -nocb: prompts are decoded only in steps where no slot is generating (llama-server's rule).
        self.cont_batching = cont_batching
        # -sp: the runner writes special tokens' text; the end token's text then ends the answer.
        self.show_special = show_special
        self.slot_prompt_similarity = slot_prompt_similarity
        self.kv = SlotKV(runner, cache or CachePolicy(), SchedulerStats())
        self.kv.sharing.register(self.slots)
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        # Groups of tasks (n choices of one prompt) waiting for slots; admitted by priority.
        self._waiting: list[list[Task]] = []
        self.admission = AdmissionControl(queue_limits or QueueLimits(), n_slots)
        self.prefill_budget = PrefillBudget(max_itl_ms)
        self._deferred_calls: list[Call] = []
        self._lora_turn = 0
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._running = True  # cleared by Shutdown; _step() also works without the thread (tests)
        # The text half of the last step's tokens, run while the next step runs (`LaterText`).
        # On with the thread; a test stepping by hand sees each step's text at once unless it sets it.
        self.overlap_text = False
        self._later: LaterText | None = None

    # --------------------------------------------------------- public (any thread)
    def start(self) -> None:
        self._running = True
        self.overlap_text = True
        self._thread = threading.Thread(target=self._run, name="llamaserve-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._inbox.put(Shutdown())
            self._thread.join(timeout=30)
            self._thread = None

    def next_task_id(self) -> int:
        return next(self._ids)

    def submit(self, task_id: int, request: GenerationRequest, sink: EventSink) -> None:
        """Queue a request; raises QueueFull at once when it would wait past --max-queue*."""
        self._enter_queue(1, len(request.prompt_tokens))
        self._inbox.put(Submit([Task(task_id, request, sink, time.perf_counter())]))

    def submit_choices(self, tasks: list[tuple[int, GenerationRequest, EventSink]]) -> None:
        """n choices of one prompt: admitted together; the prompt is decoded once."""
        self._enter_queue(len(tasks), len(tasks[0][1].prompt_tokens) if tasks else 0)
        now = time.perf_counter()
        self._inbox.put(Submit([Task(tid, req, sink, now) for tid, req, sink in tasks]))

    def _enter_queue(self, n_requests: int, n_tokens: int) -> None:
        try:
            self.admission.enter(n_requests, n_tokens)
        except QueueFull:
            self.stats.requests_rejected += 1  # submissions come from the event loop's one thread
            raise

    def abort(self, task_id: int) -> None:
        self._inbox.put(Abort(task_id))

    def call(
        self, fn: Callable[[], object], reply: Callable[[object, BaseException | None], None], *, idle_slot: int = -1
    ) -> None:
        self._inbox.put(Call(fn, reply, idle_slot))

    @property
    def stats(self) -> SchedulerStats:
        return self.kv.stats

    @stats.setter
    def stats(self, value: SchedulerStats) -> None:
        # A reload after sleep carries the old counters over (serving/sleep.py).
        self.kv.stats = value

    @property
    def n_ctx_slot(self) -> int:
        return self._n_ctx_slot

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        while self._running:
            try:
                self._step()
            except Exception:  # a bug must not kill the only thread that serves requests
                log.exception("scheduler step failed; failing the active requests")
                self._fail_all("internal error in the scheduler")

    def _has_work(self) -> bool:
        return bool(self._waiting) or bool(self._busy)

    def _step(self) -> None:
        later, self._later = self._later, None
        if later is not None and (not self._inbox.empty() or not self._has_work()):
            later.run()  # a message may end those requests (their text goes first), or none is left
        self._drain_inbox(block=not self._has_work())
        if not self._running:
            return
        self._run_deferred_calls()
        self._admit_waiting()
        self._finish_joins()
        lora = self._lora_for_step()
        plan, planned = self._build_plan(lora)
        if not plan:
            if later is not None:
                later.run()
            return
        self.stats.n_decode_total += 1
        self.stats.n_busy_slots_total += self.stats.requests_processing  # kept by _count_busy
        self.runner.set_lora(lora)
        t_step = time.perf_counter()
        if later is None:
            result = self.runner.step(plan)
        else:
            try:
                result = self.runner.step(plan, later.run)
            finally:
                later.run()  # once only: a runner that did not call it, or failed before
        if self.prefill_budget.active:  # --max-itl-ms learns what a step costs
            n_generating = sum(1 for s in planned if s.state is SlotState.GENERATING)
            n_prompt = sum(len(r.tokens) for r, s in zip(plan, planned) if s.state is SlotState.PREFILL)
            self.prefill_budget.observe(time.perf_counter() - t_step, n_generating, n_prompt)
        if result.error is not None:
            log.error("decode failed: %s", result.error)
            if result.no_space:
                # llama-server's answer: the shared cache is full, so every request in it ends
                # (500, "Context size has been exceeded.") and its KV is cleared for the next ones.
                for slot in list(self._busy):
                    self._fail_slot(slot, CONTEXT_EXCEEDED)
                return
            for slot in planned:
                self._fail_slot(slot, f"decode failed: {result.error}")
            return
        now = time.perf_counter()
        outbox: Outbox = {}
        text_later: list[tuple[Slot, Sample]] = []
        prompt_lps = result.prompt_logprobs or [[] for _ in plan]
        for i, (row, slot, samples, scored) in enumerate(zip(plan, planned, result.samples, prompt_lps)):
            if i in result.failed_rows:
                self._fail_slot(slot, result.failed_rows[i])
                continue
            if row.draft:
                self._take_verified(slot, row, samples, now, outbox)
                self.kv.sharing.note(slot)
                continue
            slot.cache_tokens.extend(row.tokens)
            self.kv.sharing.note(slot)
            slot.prompt_logprobs += scored
            if (
                self.overlap_text
                and slot.state is SlotState.GENERATING
                and len(samples) == 1
                and goes_on_whatever_its_text(slot, samples[0], self.runner)
            ):
                # The next step needs only the token: its text is made while that step runs.
                take_token_early(slot, samples[0])
                text_later.append((slot, samples[0]))
                continue
            if slot.state is SlotState.PREFILL:
                self._report_progress(slot, now, outbox)
            followers: list[Slot] = []
            if slot.state is SlotState.PREFILL and slot.prompt_remaining == 0:
                slot.t_prompt_done = now
                slot.state = SlotState.GENERATING
                self.kv.sharing.prefilled(slot)
                n_new = len(slot.prompt) - slot.n_cached
                self.stats.prompt_tokens_total += n_new
                self.stats.prompt_seconds_total += now - slot.t_start
                followers, slot.followers = slot.followers, []
                self._start_followers(slot, followers, now)
            for owner, sample in zip([slot, *followers], samples):
                if owner.task is not None:
                    self._on_token(owner, sample, now, outbox)
        deliver(outbox)
        if text_later:
            self._later = LaterText(text_later, now, self.runner)

    def _take_verified(
        self,
        slot: Slot,
        row: PlanRow,
        samples: list[Sample],
        now: float,
        outbox: Outbox,
    ) -> None:
        assert self.spec is not None
        n_accepted = apply_verified(
            slot, row, samples, self.runner, self.stats, lambda sample: self._on_token(slot, sample, now, outbox)
        )
        self.spec.accepted(slot.id, n_accepted)

    def _report_progress(self, slot: Slot, now: float, outbox: Outbox | None = None) -> None:
        """A prompt-progress report for a request that asked for them (return_progress)."""
        task = slot.task
        if task is None or not task.request.return_progress:
            return
        event = progress_event(slot, task.request, now)
        if outbox is None:
            task.sink([event])
        else:
            events_for(outbox, task).append(event)

    def _drain_inbox(self, block: bool) -> None:
        if not block and self._inbox.empty():
            return  # the usual step: raising and catching queue.Empty would cost more
        try:
            msg = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(msg)
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _start_followers(self, leader: Slot, followers: list[Slot], now: float) -> None:
        """Give each n > 1 choice a copy of the leader's prompt KV."""
        for f in followers:
            self.runner.seq_remove(f.id, 0, -1)
            f.cache_tokens = []
            self.kv.sharing.cut(f, 0)
            self.runner.seq_copy(leader.id, f.id)
            if self.kv.policy.kv_unified:  # the copy tags the leader's cells: they are peers now
                self.kv.sharing.link(leader, f, leader.n_past)
                f.lent = Lent(leader, leader.kv_epoch, leader.n_past)
            f.cache_tokens = list(leader.cache_tokens)
            f.cache_hashes = list(leader.cache_hashes)
            f.cache_lora = leader.cache_lora
            f.n_cached = leader.n_cached
            f.t_start = leader.t_start
            f.t_prompt_done = now
            f.state = SlotState.GENERATING
            self.kv.sharing.note(f, known=self.kv.sharing.held_chain(leader))

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, Submit):
            self._waiting.append(msg.tasks)
        elif isinstance(msg, Abort):
            self._abort(msg.task_id)
        elif isinstance(msg, Call):
            if msg.idle_slot >= 0 and self.slots[msg.idle_slot].busy:
                self._deferred_calls.append(msg)  # e.g. a slot save waits for the slot's request
            else:
                self._run_call(msg)
        elif isinstance(msg, Shutdown):
            self._running = False
            self._fail_all("server is shutting down")

    def _run_call(self, msg: Call) -> None:
        try:
            value = msg.fn()
        except BaseException as exc:  # handed back to the caller, not raised here
            msg.reply(None, exc)
        else:
            msg.reply(value, None)

    def _run_deferred_calls(self) -> None:
        if not self._deferred_calls:
            return
        ready = [c for c in self._deferred_calls if not self.slots[c.idle_slot].busy]
        self._deferred_calls = [c for c in self._deferred_calls if c not in ready]
        for msg in ready:
            self._run_call(msg)

    # ---------------------------------------------------------- admission
    def _admit_waiting(self) -> None:
        if not self._waiting:
            self.stats.requests_deferred = 0
            return
        if len(self._busy) == len(self.slots):
            self.stats.requests_deferred = sum(len(g) for g in self._waiting)
            return  # nothing can start: skip matching every waiting prompt against every slot
        still_waiting: list[list[Task]] = []
        # With a unified KV pool the cells decide, not the idle slots (engine/kv/room.py).
        room = KVRoom(self.slots, self.runner.n_ctx_seq) if self.kv.policy.kv_unified else None
        # Lower priority values first; equal ones in arrival order (task ids grow).
        for group in sorted(self._waiting, key=lambda g: (g[0].request.priority, g[0].id)):
            if len(self._busy) == len(self.slots):
                still_waiting.append(group)  # the last idle slot was taken: the rest wait
                continue
            if room is not None and not room.take(group[0].request, len(group)):
                still_waiting.append(group)
                continue
            if len(group) == 1:
                slot = choose_slot(self.slots, group[0].request, self.slot_prompt_similarity)
                if slot is None:
                    still_waiting.append(group)
                else:
                    self._start(slot, group[0])
                continue
            idle = [s for s in self.slots if not s.busy]
            if len(idle) < len(group):
                still_waiting.append(group)
                continue
            leader = choose_slot(self.slots, group[0].request, self.slot_prompt_similarity)
            if leader is None:  # the id_slot the choices asked for is busy: wait for it
                still_waiting.append(group)
                continue
            if self._start(leader, group[0]):
                others = [s for s in idle if s is not leader]
                for slot, task in zip(others, group[1:]):
                    self._start_follower(slot, task, leader)
            else:
                for task in group[1:]:
                    task.sink([Failed("the prompt could not be started")])
        kept = {id(g) for g in still_waiting}
        left = [g for g in self._waiting if id(g) not in kept]
        self._waiting = still_waiting
        self.stats.requests_deferred = sum(len(g) for g in still_waiting)
        self._left_queue(left)

    def _count_busy(self) -> None:
        """A slot started or finished: the busy list for planning, the busy count for /metrics, the idle
        one for the queue limits."""
        self._busy = [s for s in self.slots if s.busy]
        self.stats.requests_processing = len(self._busy)
        self.admission.set_idle_slots(len(self.slots) - len(self._busy))

    def _left_queue(self, groups: list[list[Task]]) -> None:
        """These groups stopped waiting (started, failed or aborted): the queue limits count them out."""
        for group in groups:
            if group:
                self.admission.leave(len(group), len(group[0].request.prompt_tokens))

    def _start(self, slot: Slot, task: Task) -> bool:
        req = task.request
        prompt = req.prompt_tokens
        if not prompt:
            task.sink([Failed("the prompt is empty")])
            return False
        if len(prompt) >= slot.n_ctx:
            task.sink(
                [
                    Failed(
                        f"the request exceeds the available context size ({len(prompt)} tokens, "
                        f"context is {slot.n_ctx}); try increasing it",
                        kind="exceed_context_size_error",
                        extra={"n_prompt_tokens": len(prompt), "n_ctx": slot.n_ctx},
                    )
                ]
            )
            return False
        # Before this slot's KV is prepared, so that a state restored from host memory finds room.
        self.kv.park_idle([s for s in self.slots if s is not slot])
        keep, shared = self.kv.prepare(slot, req)
        bind_task(slot, task, SlotState.PREFILL, self.runner.new_sampler(req.sampling))
        slot.n_cached = keep
        slot.n_shared = shared
        self.stats.prompt_tokens_cached_total += keep
        self.stats.prompt_tokens_shared_total += shared
        self.kv.begin_prefill(slot)  # or wait for a prefill in progress that writes its prefix
        self.stats.queue_seconds_total += slot.t_start - task.t_submit if task.t_submit else 0.0
        self.kv.free_idle_cells(self.slots, self.runner.n_ctx_seq)
        self._count_busy()
        self._report_progress(slot, slot.t_start)  # the first report: only the cached part is done
        return True

    def _finish_joins(self) -> None:
        """Requests waiting for another prefill to write their prefix: those whose leader wrote
        it (or stopped) share it now and prefill the rest of their prompt from this step on."""
        for slot in self._busy:
            if slot.state is not SlotState.JOINING or not self.kv.sharing.join_ready(slot):
                continue
            self.kv.finish_join(slot)
            self._report_progress(slot, time.perf_counter())

    def _start_follower(self, slot: Slot, task: Task, leader: Slot) -> None:
        bind_task(slot, task, SlotState.FOLLOWING, self.runner.new_sampler(task.request.sampling))
        leader.followers.append(slot)
        self._count_busy()

    # -------------------------------------------------------------- planning
    def _lora_for_step(self) -> tuple[float, ...]:
        """The adapter scales of this step: one set per decode, taking turns when requests differ."""
        sets = adapter_sets(self._busy)
        if len(sets) <= 1:
            return sets[0] if sets else ()
        self._lora_turn += 1
        return sets[self._lora_turn % len(sets)]

    def _build_plan(self, lora: tuple[float, ...]) -> tuple[list[PlanRow], list[Slot]]:
        """One step's rows: slots running under adapter scales ``lora`` only."""
        # One micro-batch per step, not a whole -b batch: llama.cpp computes a
        # batch one micro-batch at a time anyway (measured: the same 2,000-token
        # prefill in one call or four), and a step that ends sooner lets
        # generating slots advance and an abandoned prompt stop after <= n_ubatch
        # tokens instead of after all of them.
        synth_for = self.spec.synth_for if self.spec is not None else None
        decoding = decode_rows_beside_prefill(self._busy, lora)
        plan, planned, budget = plan_generating(
            decoding, lora, self._drafts(decoding, lora), synth_for, self.runner.n_ubatch
        )
        if plan and not self.cont_batching:
            return plan, planned  # without continuous batching a new prompt waits for the generating slots
        if plan:
            budget = self.prefill_budget.prompt_tokens(budget)  # --max-itl-ms
        plan_prefill(self._busy, lora, budget, self.runner.n_ubatch, plan, planned)
        return plan, planned

    def _drafts(self, slots: list[Slot], lora: tuple[float, ...]) -> dict[int, list[int]]:
        """Speculative drafts for this step's generating ``slots``, sharing the micro-batch evenly."""
        if self.spec is None:
            return {}
        ready = [
            s
            for s in slots
            if s.state is SlotState.GENERATING
            and s.next_token is not None
            and s.task is not None
            and s.task.request.lora == lora
        ]
        share = self.runner.n_ubatch // max(len(ready), 1)
        return self.spec.drafts([(s, self.spec.limit(s, share)) for s in ready])

    # ------------------------------------------------------------ results
    def _on_token(self, slot: Slot, sample: Sample, now: float, outbox: Outbox) -> None:
        task = slot.task
        assert task is not None
        events = events_for(outbox, task)
        stop_type = take_token(slot, sample, now, self.runner, self.kv, self.show_special, events)
        if stop_type:
            events.append(self._finish(slot, stop_type, now))

    def _finish(self, slot: Slot, stop_type: str, now: float) -> Finished:
        finished = finished_event(slot, stop_type, now)
        self.stats.count_finished(finished.timings, slot.n_past + 1)
        self.admission.served(now - slot.t_start)
        self._release(slot)
        return finished

    def _release(self, slot: Slot) -> None:
        if slot.state is SlotState.FOLLOWING:  # only a follower still waiting is on a leader's list
            for other in self.slots:
                if slot in other.followers:
                    other.followers.remove(slot)
        orphans, slot.followers = slot.followers, []
        for f in orphans:  # the leader went away before its prompt was decoded
            if f.task is not None:
                f.task.sink(
                    [Failed("the request was stopped before its prompt was processed", kind="server_error", status=500)]
                )
            self._release(f)
        if slot.sampler is not None:
            slot.sampler.close()
        self.kv.sharing.prefilled(slot)
        slot.clear_task()
        slot.state = SlotState.IDLE
        slot.last_used = time.perf_counter()
        self._count_busy()

    # ------------------------------------------------------ abort and failure
    def _abort(self, task_id: int) -> None:
        for group in list(self._waiting):
            for task in group:
                if task.id == task_id:
                    group.remove(task)
                    self.admission.leave(1, len(task.request.prompt_tokens) if not group else 0)
                    if not group:
                        self._waiting.remove(group)
                    return
        for slot in self.slots:
            if slot.task is not None and slot.task.id == task_id:
                # The KV already decoded stays valid and remains reusable.
                task = slot.task
                finished = self._finish(slot, "abort", time.perf_counter())
                task.sink([finished])
                return

    def _fail_slot(self, slot: Slot, message: str) -> None:
        task = slot.task
        self.runner.seq_remove(slot.id, 0, -1)
        slot.cache_tokens.clear()
        slot.cache_hashes.clear()
        self.kv.sharing.cut(slot, 0)
        self._release(slot)
        if task is not None:
            task.sink([Failed(message, kind="server_error", status=500)])

    def _fail_all(self, message: str) -> None:
        for slot in self.slots:
            if slot.busy:
                self._fail_slot(slot, message)
        waiting, self._waiting = self._waiting, []
        self._left_queue(waiting)
        for group in waiting:
            for task in group:
                task.sink([Failed(message, kind="unavailable_error", status=503)])
