"""Executes a scheduler's plan: the model, and KV-cache tensors keyed by seq id.

A prompt is prefilled into a cache of its own; when it is done the sequence joins the running
batch, whose KV cache is one preallocated slot per sequence (pipeline/continuous/slots.py): its
prompt is copied into a free slot, and each decode step writes one column per row in place. A
sequence that leaves frees its slot, the last row moving into it, so the running rows are always
slots [0, rows). A decode step's shapes are (rows, width), width a whole number of attention
chunks; on CUDA rows are bucketed and each shape's step is replayed from a CUDA graph
(pipeline/continuous/cuda_graphs.py).

Token choice follows the model's repetition penalty, exactly as transformers'
RepetitionPenaltyLogitsProcessor, then is greedy or sampled per row
(pipeline/continuous/sampling.py). The tokens each row has seen are one (slots, capacity)
tensor aligned with the cache (past a row's length, its first token, which the penalty already
counts), so the penalty is one batched gather/scatter.
"""
from __future__ import annotations

from typing import Any, Sequence

from pipeline.continuous.cuda_graphs import DecodeGraphs, bucket
from pipeline.continuous.sampling import TokenChooser
from pipeline.continuous.scheduler import PrefillChunk, RunnerOutput, SchedulerOutput, SequenceState
from pipeline.continuous.slots import SlotCache, chunks_for


class ModelRunner:
    def __init__(self, model, *, repetition_penalty: float = 1.0, device: str = "cpu", max_batch: int = 8,
                 kv_cache_tokens: int = 8192):
        import torch

        from pipeline.kernels.versions import check_kernel_versions
        check_kernel_versions(device)
        self.torch = torch
        self.model = model
        self.device = device
        self.repetition_penalty = float(repetition_penalty)
        self.max_batch = max_batch
        self.kv_cache_tokens = kv_cache_tokens  # the slots' tokens together, at most (the scheduler admits by it)
        self.chooser = TokenChooser(device)
        self.rows: list[int] = []  # seq id in each slot, slots [0, rows) in order
        self.lengths: list[int] = []  # columns each row's slot holds
        self.budgets: list[int] = []  # each row's prompt + max new tokens: the columns it may fill
        # Typed Any: torch is imported on first use, not at module import. None until a sequence joins.
        self.cache: SlotCache | None = None
        self.seen: Any = None  # (slots, capacity) token ids, column for column with the cache
        self._prefill_caches: dict[int, Any] = {}  # seq id -> its own cache until it joins
        self.graphs = DecodeGraphs(self._forward) if device.startswith("cuda") else None

    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        """Decode the running batch, then run the prompt chunks.

        Decoding first lets a prompt finished in this plan join the batch at the
        next plan's decode, so the plan alone says who decodes; the order of
        forward passes over time is the same as prefill-then-decode.
        """
        out = RunnerOutput()
        if plan.decode:
            self._decode_step(plan.decode, out)
        for chunk in plan.prefill:
            self._prefill_step(chunk, out)
        return out

    def _decode_step(self, seqs: list[SequenceState], out: RunnerOutput) -> None:
        try:
            for seq in seqs:
                if seq.seq_id not in self.rows:
                    self.join(seq)
            tokens = self.decode(seqs)
        except Exception as exc:  # a step failure leaves no sane cache: the whole batch fails
            self.release(self.rows + [s.seq_id for s in seqs])
            out.failed.update((s.seq_id, exc) for s in seqs)
            return
        out.decoded.update(zip((s.seq_id for s in seqs), tokens))

    def _prefill_step(self, chunk: PrefillChunk, out: RunnerOutput) -> None:
        seq_id = chunk.seq.seq_id
        try:
            token = self.prefill_chunk(*chunk)
        except Exception as exc:  # this prompt alone fails; the batch goes on
            self.release([seq_id])
            out.failed[seq_id] = exc
            return
        out.prefilled[seq_id] = chunk.end
        if token is not None:
            out.first_tokens[seq_id] = token

    def _choose(self, logits, seen, seqs: Sequence[SequenceState] = ()) -> list[int]:
        """Each row's token (greedy or its own sampling) after the repetition penalty over `seen` (rows, k)
        token ids, repeats allowed: RepetitionPenaltyLogitsProcessor's gather/where/scatter, for all rows at once."""
        torch = self.torch
        logits = logits.float()
        if self.repetition_penalty != 1.0:
            score = logits.gather(1, seen)
            score = torch.where(score < 0, score * self.repetition_penalty, score / self.repetition_penalty)
            logits.scatter_(1, seen, score)
        return self.chooser.choose(logits, seqs)

    def prefill_chunk(self, seq: SequenceState, start: int, end: int) -> int | None:
        """Run prompt tokens [start, end) of one sequence; the first new token when the prompt is done."""
        torch = self.torch
        from transformers import DynamicCache
        cache = self._prefill_caches.get(seq.seq_id) or DynamicCache()
        ids = torch.tensor([seq.prompt_ids[start:end]], device=self.device)
        positions = torch.arange(start, end, device=self.device).unsqueeze(0)
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
        self._prefill_caches[seq.seq_id] = out.past_key_values
        if end < seq.prompt_len:
            return None
        return self._choose(out.logits[:, -1, :], torch.tensor([seq.prompt_ids], device=self.device), [seq])[0]

    def join(self, seq: SequenceState) -> None:
        """Copy a fully prefilled sequence's cache into the next free slot."""
        torch = self.torch
        own = self._prefill_caches.pop(seq.seq_id).layers
        keys, values = [layer.keys for layer in own], [layer.values for layer in own]
        slot = len(self.rows)
        budgets = self.budgets + [seq.budget_tokens]
        if self.cache is None or slot >= self.cache.slots or seq.budget_tokens > self.cache.capacity:
            self._resize(keys, budgets)
        cache = self.cache
        assert cache is not None
        cache.store(slot, keys, values)
        self.seen[slot].fill_(seq.prompt_ids[0])
        self.seen[slot, :seq.prompt_len].copy_(torch.tensor(seq.prompt_ids, device=self.device))
        self.rows.append(seq.seq_id)
        self.lengths.append(seq.prompt_len)
        self.budgets = budgets

    def _resize(self, like_keys: list, budgets: list[int]) -> None:
        """Slots as long as the longest of `budgets` (whole chunks), as many as fit kv_cache_tokens
        (at most max_batch), the running rows copied over."""
        capacity = chunks_for(max(budgets))
        slots = min(self.max_batch, self.kv_cache_tokens // capacity)
        if slots < len(budgets):
            raise RuntimeError(f"{len(budgets)} slots of {capacity} tokens exceed the {self.kv_cache_tokens}-token "
                               f"KV cache: the scheduler admitted past it")
        if self.cache is None:
            self.cache = SlotCache(like_keys, slots, capacity)
            self.seen = self.torch.zeros((slots, capacity), dtype=self.torch.long, device=self.device)
        else:
            rows = len(self.rows)
            self.cache = self.cache.resized(slots, capacity, rows)
            seen = self.seen.new_zeros((slots, capacity))
            seen[:rows] = self.seen[:rows, :1]  # new columns repeat each row's first token, as join fills them
            width = min(capacity, self.seen.shape[1])
            seen[:rows, :width].copy_(self.seen[:rows, :width])
            self.seen = seen
        if self.graphs is not None:
            self.graphs.clear()

    def decode(self, seqs: Sequence[SequenceState]) -> list[int]:
        """One step for every running sequence (any order): feed its last token, get its next."""
        torch, cache = self.torch, self.cache
        assert cache is not None
        slot_of = {seq_id: slot for slot, seq_id in enumerate(self.rows)}
        if sorted(s.seq_id for s in seqs) != sorted(self.rows):
            raise RuntimeError(f"decode plan {[s.seq_id for s in seqs]} does not match the batch's rows {self.rows}")
        n = len(self.rows)
        rows = n if self.graphs is None else bucket(n, cache.slots)
        ordered: list[Any] = [None] * n
        fed, columns = [0] * rows, [0] * rows  # spare rows: token 0 at column 0 of a free slot
        for seq in seqs:
            slot = slot_of[seq.seq_id]
            ordered[slot], fed[slot], columns[slot] = seq, seq.generated[-1], self.lengths[slot]
        width = chunks_for(max(columns) + 1)
        ids = torch.tensor(fed, device=self.device).unsqueeze(1)
        at = torch.tensor(columns, device=self.device)
        self.seen[torch.arange(n, device=self.device), at[:n]] = ids[:n, 0]  # now prompt + generated
        with torch.inference_mode():
            logits = self._forward(ids, at, width) if self.graphs is None else self.graphs.run(ids, at, width)
        self.lengths = [length + 1 for length in self.lengths]
        tokens = self._choose(logits[:n], self.seen[:n, :width], ordered)
        return [tokens[slot_of[seq.seq_id]] for seq in seqs]

    def _forward(self, ids, columns, width: int):
        """The model over rows [0, len(ids)) of the slot cache: (rows, 1) ids at (rows,) columns -> (rows, vocab)
        logits. No host synchronisation: on CUDA this is what a graph records."""
        cache = self.cache
        assert cache is not None
        cache.begin_step(columns, width)
        visible = cache.visible(columns, width)
        # A 4-d mask per layer type is taken as is; the keys start at column 0 in every row.
        out = self.model(input_ids=ids, position_ids=columns[:, None], attention_mask={"full_attention": visible},
                         past_key_values=cache, use_cache=True, keys_start_at_column_0=True)
        return out.logits[:, -1, :]

    def release(self, seq_ids: Sequence[int]) -> None:
        """Free the tensors of sequences that left: each running one's slot takes the last row."""
        gone = set(seq_ids)
        self.chooser.release(list(gone))
        for seq_id in gone:
            self._prefill_caches.pop(seq_id, None)
            if seq_id not in self.rows:
                continue
            slot, last = self.rows.index(seq_id), len(self.rows) - 1
            if slot != last:
                assert self.cache is not None
                self.cache.move(last, slot, self.lengths[last])
                self.seen[slot].copy_(self.seen[last])
                self.rows[slot], self.lengths[slot] = self.rows[last], self.lengths[last]
                self.budgets[slot] = self.budgets[last]
            self.rows.pop()
            self.lengths.pop()
            self.budgets.pop()

    def cache_tokens(self) -> int:
        """Cache columns held by the running batch (rows x capacity, unused columns included)."""
        return 0 if self.cache is None else len(self.rows) * self.cache.capacity
