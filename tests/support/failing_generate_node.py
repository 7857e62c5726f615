"""A real worker whose continuous generate engine breaks once warmed up: every iteration raises, and so does
releasing a sequence (the stage's cleanup), so the stage's thread dies as a broken engine would
kill it. `python -m tests.support.failing_generate_node` with a worker's environment
(continuous batching, the only mode); its first request fails with the iteration's error, the
rest with StageDown, and its /health says unhealthy."""
from __future__ import annotations

import sys
import types

from pipeline.continuous import ContinuousEngine
from services import node


class EngineBroken(RuntimeError):
    """The failure this node's engine is built to have."""


def break_engine() -> None:
    """Every ContinuousEngine of this process, once warmed up (its node then reports ready), fails to
    step and to cancel a sequence."""
    warm_up = ContinuousEngine.warm_up

    def step(self):
        raise EngineBroken("this engine fails every iteration (tests.support.failing_generate_node)")

    def cancel(self, seq):
        raise EngineBroken("this engine fails to release a sequence too (tests.support.failing_generate_node)")

    def warm_up_then_break(self, requests):
        sequences = warm_up(self, requests)
        self.step, self.cancel = types.MethodType(step, self), types.MethodType(cancel, self)
        return sequences

    ContinuousEngine.warm_up = warm_up_then_break


def main() -> int:
    break_engine()
    return node.main()


if __name__ == "__main__":
    sys.exit(main())
