"""Continuous batching for the LLM: a scheduler that decides, a runner that executes.

As in vLLM v1, each iteration is schedule -> execute -> update:
`Scheduler.plan()` returns a `SchedulerOutput` (plain data, the runner's only
input), `ModelRunner.execute(plan)` returns a `RunnerOutput` (tokens by seq id),
and `Scheduler.update_from_output` is the one place sequence state changes.
The scheduler holds every sequence's state (no tensors, tested with no model);
the runner executes over one slot table (`SlotTable`: each held sequence's row, length,
budget, seen tokens, sampling state and K/V slot), whose `SlotRule` is the one capacity rule
the scheduler admits by. `ContinuousEngine` ties them to one Generator's model.
"""
from pipeline.continuous.engine import ContinuousEngine, EngineStats, StepResult
from pipeline.continuous.runner import ModelRunner
from pipeline.continuous.scheduler import (
                                           PrefillChunk,
                                           RunnerOutput,
                                           Scheduler,
                                           SchedulerOutput,
                                           SequenceState,
                                           UpdateResult,
)
from pipeline.continuous.slots import SlotRule, SlotTable

__all__ = ["ContinuousEngine", "EngineStats", "ModelRunner", "PrefillChunk", "RunnerOutput", "Scheduler", "SchedulerOutput",
           "SequenceState", "SlotRule", "SlotTable", "StepResult", "UpdateResult"]
