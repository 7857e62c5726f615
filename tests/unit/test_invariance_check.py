"""profiling.invariance_check: the requests it sends and how it finds a reply that moved."""
from __future__ import annotations

from profiling import invariance_check
from profiling.invariance_check import AMONG, bodies, compare


def test_each_target_is_among_8_others_every_request_its_own_id_and_sampled_its_own_seed():
    for targets in (1, 3, 9):
        for mode in ("greedy", "seeded"):
            aimed, fillers = bodies(targets, mode)
            everyone = aimed + fillers
            assert len(aimed) == targets and len(everyone) >= AMONG + 1
            assert len({b["request_id"] for b in everyone}) == len(everyone)
            assert len({b["query"] for b in everyone}) == len(everyone)  # no question answered twice
            seeds = [b.get("seed") for b in everyone]
            assert (seeds == [None] * len(everyone)) == (mode == "greedy")
            if mode == "seeded":
                assert len(set(seeds)) == len(everyone) and all(b["temperature"] > 0 for b in everyone)


def test_a_target_whose_reply_among_others_moved_is_named(monkeypatch):
    aimed, fillers = bodies(3, "greedy")
    moved = aimed[1]["request_id"]
    sent = []

    def ask(url, body, suffix, timeout):
        sent.append(body["request_id"] + suffix)
        shifted = suffix == "-among" and body["request_id"] == moved
        return {"generated_response": body["query"] + ("!" if shifted else "")}

    monkeypatch.setattr(invariance_check, "ask", ask)
    found = compare("http://127.0.0.1:1", aimed, fillers, timeout=1.0)
    assert found["differ"] == [moved] and found["in_flight"] == AMONG + 1
    assert sorted(sent) == sorted([b["request_id"] + "-alone" for b in aimed] +
                                  [b["request_id"] + "-among" for b in aimed + fillers])
    monkeypatch.setattr(invariance_check, "ask", lambda url, body, suffix, timeout: {"a": body["query"]})
    assert compare("http://127.0.0.1:1", aimed, fillers, timeout=1.0)["differ"] == []
