"""Executes a scheduler's plan: the model over the slot table (pipeline/continuous/slots.py).

A sequence takes a slot when it is admitted; its prompt's chunks are written straight into that slot,
each chunk attending over the slot's columns [0, end); once its prompt is in it decodes, each step
writing one column per row in place. A decode step runs slots [0, rows), rows reaching the last
decoding one: a slot still prefilling below it rides along idle (token 0 written at its next prompt
column, which its next chunk overwrites; its logits unread), which batch invariance leaves without
effect on the others. A step's shapes are (rows, width), width a whole number of attention chunks; on
CUDA rows are bucketed and each shape's step is replayed from a CUDA graph
(pipeline/continuous/cuda_graphs.py), the whole grid recorded at warm-up (:meth:`ModelRunner.record_graphs`).

Token choice follows the model's repetition penalty, exactly as transformers'
RepetitionPenaltyLogitsProcessor, then is greedy or sampled per row
(pipeline/continuous/sampling.py). The tokens each row has seen are the table's (slots, capacity)
tensor aligned with its keys (past a row's length, its first token, which the penalty already
counts), so the penalty is one batched gather/scatter, or one C++ pass a row where every row is greedy.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Sequence

from pipeline.continuous.cuda_graphs import DecodeGraphs, bucket, row_buckets
from pipeline.continuous.sampling import TokenChooser
from pipeline.continuous.scheduler import PrefillChunk, RunnerOutput, SchedulerOutput, SequenceState
from pipeline.continuous.slots import SlotRule, SlotTable, chunks_for

# A prefilling slot among the decoding ones, to the token chooser: greedy, no log probabilities (its own
# sampling and random stream stay untouched).
_IDLE_ROW = SimpleNamespace(sampling=None, logprob=None)


class ModelRunner:
    def __init__(self, model, rule: SlotRule, *, repetition_penalty: float = 1.0, device: str = "cpu"):
        import torch

        from pipeline.continuous.qwen2_step import qwen2_decode_step
        from pipeline.kernels.versions import check_kernel_versions
        check_kernel_versions(device)
        self.torch = torch
        self.model = model
        self.device = device
        self.chooser = TokenChooser(float(repetition_penalty))
        self.table = SlotTable(rule, device)
        self.graphs = DecodeGraphs(self._forward) if device.startswith("cuda") else None
        # On the CPU a Qwen2 decoder's decode step skips transformers' per-layer glue (same bits).
        self.fast_step = qwen2_decode_step(model, self.table) if self.graphs is None else None

    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        """Give the admitted their slots, decode the running batch, then run the prompt chunks.

        Decoding first lets a prompt finished in this plan join the batch at the
        next plan's decode, so the plan alone says who decodes; the order of
        forward passes over time is the same as prefill-then-decode.
        """
        out = RunnerOutput()
        for seq in plan.admitted:
            self.table.join(seq.seq_id, seq.prompt_ids, seq.budget_tokens, seq.sampling)
        if plan.decode:
            self._decode_step(plan.decode, out)
        for chunk in plan.prefill:
            self._prefill_step(chunk, out)
        return out

    def _decode_step(self, seqs: list[SequenceState], out: RunnerOutput) -> None:
        try:
            tokens = self.decode(seqs)
        except Exception as exc:  # a step failure leaves no sane rows: every decoding sequence fails
            self.release([s.seq_id for s in seqs])
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

    def _choose(self, logits, seen, rows: Sequence[Any] = ()) -> list[int]:
        """Each row's token (greedy or as rows[i] samples) after the repetition penalty over `seen` (rows, k)
        token ids, repeats allowed."""
        return self.chooser.choose(logits, seen, rows)

    def prefill_chunk(self, seq: SequenceState, start: int, end: int) -> int | None:
        """Write prompt tokens [start, end) of one sequence into its slot; the first new token when the
        prompt is done."""
        torch, table = self.torch, self.table
        slot = table.slot_of(seq.seq_id)
        ids = torch.tensor([seq.prompt_ids[start:end]], device=self.device)
        positions = torch.arange(start, end, device=self.device).unsqueeze(0)
        # The first chunk sees its own keys causally (no mask, as a whole prompt alone is run); a later
        # one sees every column before it and its own causally: query i is column start + i.
        mask = None if start == 0 else (torch.arange(end, device=self.device)[None, :]
                                        <= positions[0, :, None])[None, None]
        table.begin_prefill(slot, start, end)
        out = self.model(input_ids=ids, position_ids=positions, attention_mask={"full_attention": mask},
                         past_key_values=table, use_cache=True, logits_to_keep=1, keys_start_at_column_0=True)
        table.rows[slot].length = end
        if end < seq.prompt_len:
            return None
        table.rows[slot].decoding = True
        return self._choose(out.logits[:, -1, :], table.seen[slot:slot + 1, :seq.prompt_len], [table.rows[slot]])[0]

    def decode(self, seqs: Sequence[SequenceState]) -> list[int]:
        """One step for every running sequence (any order): feed its last token, get its next."""
        torch, table = self.torch, self.table
        slots = [table.slot_of(seq.seq_id) for seq in seqs]
        if sorted(slots) != [slot for slot, row in enumerate(table.rows) if row.decoding]:
            raise RuntimeError(f"decode plan {[s.seq_id for s in seqs]} does not match the table's decoding rows")
        n = max(slots) + 1
        rows = n if self.graphs is None else bucket(n, table.slots)
        # Every row writes at its next column: a prefilling one where its next chunk goes, a free slot at 0.
        columns = [row.length for row in table.rows[:rows]] + [0] * (rows - min(rows, len(table.rows)))
        fed = [0] * rows
        for seq, slot in zip(seqs, slots):
            fed[slot] = seq.generated[-1]
        width = chunks_for(max(columns[:n]) + 1)
        # One small tensor a step, not one per list: row 0 the fed ids, row 1 the columns (views of it).
        packed = torch.tensor([fed, columns], device=self.device)
        ids, at = packed[0].unsqueeze(1), packed[1]
        every_row = len(slots) == n  # every row below n decodes (slots are compact: in some order)
        if every_row:
            table.seen[:n].scatter_(1, at[:n, None], ids[:n])  # now prompt + generated
        else:
            order = torch.tensor(slots, device=self.device)
            table.seen[order, at[order]] = ids[order, 0]
        if self.graphs is None:
            logits = self._forward(ids, at, width)
        else:
            logits = self.graphs.run(ids, at, width, layout=table.capacity)
        for slot in slots:
            table.rows[slot].length += 1
        # Chosen in slot order, a prefilling row among them as an idle greedy one (its token unread): each row's
        # choice is its own, and gathering the decoding rows' logits would copy them (rows x vocabulary) a step.
        chosen = self._choose(logits[:n], table.seen[:n, :width],
                              [row if row.decoding else _IDLE_ROW for row in table.rows[:n]])
        return [chosen[slot] for slot in slots]

    def _forward(self, ids, columns, width: int):
        """The model over rows [0, len(ids)) of the slot table: (rows, 1) ids at (rows,) columns -> (rows, vocab)
        logits. No host synchronisation: on CUDA this is what a graph records."""
        if self.fast_step is not None and self.fast_step.ready():
            return self.fast_step(ids, columns, width)
        return self.model_forward(ids, columns, width)

    def model_forward(self, ids, columns, width: int):
        """:meth:`_forward` by the model's own forward (transformers' glue): on CUDA (recorded once, replayed),
        for a model :mod:`pipeline.continuous.qwen2_step` does not take, and as the fast step's yardstick."""
        table = self.table
        table.begin_step(columns, width)
        visible = table.visible(columns, width)
        # A 4-d mask per layer type is taken as is; the keys start at column 0 in every row.
        out = self.model(input_ids=ids, position_ids=columns[:, None], attention_mask={"full_attention": visible},
                         past_key_values=table, use_cache=True, keys_start_at_column_0=True)
        return out.logits[:, -1, :]

    def record_graphs(self) -> None:
        """On CUDA, record the decode step of every (rows bucket, width) of the table's usual layout: max_batch
        slots of its share of the KV budget. Only while no sequence holds a slot (the engine's warm-up)."""
        if self.graphs is None:
            return
        table = self.table
        if table.rows:
            raise RuntimeError("CUDA graphs are recorded only while no sequence holds a slot")
        slots, capacity = table.rule.layout()
        if (table.slots, table.capacity) != (slots, capacity):
            raise RuntimeError(f"the slot table's layout is {table.slots} x {table.capacity}, not the usual "
                               f"{slots} x {capacity}")
        chunk = table.rule.chunk
        shapes = [(rows, width) for rows in row_buckets(slots) for width in range(chunk, capacity + 1, chunk)]
        with self.torch.inference_mode():
            self.graphs.record(shapes, self.device, layout=capacity)

    def release(self, seq_ids: Sequence[int]) -> None:
        """Free the slots of sequences that left. In inference mode whoever calls: the K/V buffers were
        written in the step's inference mode, and the last row's move into a freed slot updates them in
        place (a cancel from the generate stage's loop comes from outside any)."""
        with self.torch.inference_mode():
            for seq_id in set(seq_ids):
                self.table.leave(seq_id)

    def cache_tokens(self) -> int:
        """Cache columns held by the held rows (rows x capacity, unused columns included)."""
        return self.table.columns_held()

    def graph_counts(self) -> tuple[int, int]:
        """CUDA graphs recorded, and shapes that failed to record (both 0 off CUDA)."""
        return (0, 0) if self.graphs is None else (self.graphs.recorded, self.graphs.failed)
