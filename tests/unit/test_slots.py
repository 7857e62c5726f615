"""pipeline/continuous/slots.py: the slot rule's layouts within the KV budget, and the slot table's
writes, moves and relayouts in place."""
from __future__ import annotations

import pytest

from pipeline.continuous.slots import SlotRule
from pipeline.kernels.chunked_attention import CHUNK


def test_the_slot_rule_lays_out_equal_shares_and_longer_slots_only_while_a_longer_budget_is_held():
    rule = SlotRule(max_batch=4, kv_cache_tokens=16 * CHUNK, chunk=CHUNK)
    assert rule.base_capacity == 4 * CHUNK and rule.layout() == (4, 4 * CHUNK)
    assert rule.layout([CHUNK + 1, 3 * CHUNK]) == (4, 4 * CHUNK)  # within the share: the usual layout
    assert rule.layout([5 * CHUNK + 1]) == (2, 6 * CHUNK)  # longer: fewer, longer slots
    assert rule.fits([10] * 4) and not rule.fits([10] * 5)  # never past max_batch
    assert rule.fits([6 * CHUNK, 10]) and not rule.fits([6 * CHUNK, 10, 10])
    assert rule.admits(16 * CHUNK) and not rule.admits(16 * CHUNK + 1)
    small = SlotRule(max_batch=8, kv_cache_tokens=3 * CHUNK, chunk=CHUNK)  # less than a chunk each
    assert small.layout() == (3, CHUNK)


def _table(max_batch=3, kv_cache_tokens=6 * CHUNK):
    from pipeline.continuous.slots import SlotTable
    return SlotTable(SlotRule(max_batch, kv_cache_tokens, CHUNK))


def _prefill(table, slot: int, start: int, end: int, fill: float):
    """A prefill pass's write of one layer (kv heads 2, head size 4): columns [start, end) = fill."""
    import torch
    table.begin_prefill(slot, start, end)
    keys, values = table.update(torch.full((1, 2, end - start, 4), fill), torch.full((1, 2, end - start, 4), -fill), 0)
    table.rows[slot].length = end
    return keys, values


def test_a_slot_table_prefills_into_the_slot_and_a_step_writes_each_rows_column():
    import torch
    table = _table()
    assert table.join(10, [5, 6, 7], 20) == 0 and table.join(11, [8, 9], 300) == 1
    keys, values = _prefill(table, 1, 0, 2, 1.0)
    assert keys.shape == (1, 2, 2, 4) and torch.equal(values, torch.full((1, 2, 2, 4), -1.0))
    keys, _ = _prefill(table, 1, 2, 5, 2.0)  # a later chunk reads the columns before it, from column 0
    assert keys.shape == (1, 2, 5, 4) and torch.equal(keys[0, :, :2], torch.ones(2, 2, 4))
    assert torch.equal(table.seen[0, :4], torch.tensor([5, 6, 7, 5])) and (table.seen[1, 2:] == 8).all()
    columns = torch.tensor([0, 5])
    table.begin_step(columns, CHUNK)
    keys, _ = table.update(torch.full((2, 2, 1, 4), 7.0), torch.full((2, 2, 1, 4), 8.0), 0)
    assert keys.shape == (2, 2, CHUNK, 4)
    assert torch.equal(keys[1, :, 5], torch.full((2, 4), 7.0)) and torch.equal(keys[1, :, 4], torch.full((2, 4), 2.0))
    visible = table.visible(columns, CHUNK)
    assert visible.shape == (2, 1, 1, CHUNK) and visible[0].sum() == 1 and visible[1].sum() == 6


def test_a_leaving_row_takes_the_last_one_and_a_longer_joiner_relays_the_rows_in_place():
    import torch
    table = _table(max_batch=3, kv_cache_tokens=6 * CHUNK)
    assert (table.slots, table.capacity) == (3, 2 * CHUNK)
    for seq_id, fill in ((1, 1.0), (2, 2.0), (3, 3.0)):
        slot = table.join(seq_id, [seq_id, 40], 100)
        _prefill(table, slot, 0, 2, fill)
    storage = table.keys[0].untyped_storage().data_ptr()
    table.leave(1)  # the last row (3) moves into slot 0
    assert [r.seq_id for r in table.rows] == [3, 2] and torch.equal(table.keys[0][0, :, :2], torch.full((2, 2, 4), 3.0))
    assert table.seen[0, 0] == 3 and (table.seen[0, 2:] == 3).all()
    table.leave(2)
    with pytest.raises(KeyError):
        table.slot_of(2)
    # A joiner longer than the share: two slots of three chunks, the held row moved within the same buffer.
    assert table.join(4, [9] * 3, 2 * CHUNK + 1) == 1 and (table.slots, table.capacity) == (2, 3 * CHUNK)
    assert table.keys[0].untyped_storage().data_ptr() == storage
    assert torch.equal(table.keys[0][0, :, :2], torch.full((2, 2, 4), 3.0)) and table.rows[0].length == 2
    assert torch.equal(table.values[0][0, :, :2], torch.full((2, 2, 4), -3.0))
    assert table.seen[0, 1] == 40 and (table.seen[0, 2:] == 3).all()  # new columns repeat the first token
    with pytest.raises(RuntimeError, match="slot rule"):
        table.join(5, [1], 10)  # a third slot does not fit beside the long one
    table.leave(4)
    table.join(5, [1], 10)
    assert (table.slots, table.capacity) == (2, 3 * CHUNK)  # it fits the layout at hand: no move
    table.join(6, [1], 10)
    assert (table.slots, table.capacity) == (3, 2 * CHUNK)  # back to the usual layout, the rows moved again
    assert torch.equal(table.keys[0][0, :, :2], torch.full((2, 2, 4), 3.0)) and (table.seen[0, 2:] == 3).all()
    assert table.columns_held() == 3 * 2 * CHUNK
