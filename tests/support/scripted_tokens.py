"""What the wrapped worker nodes (tests.support.tool_calling_node, slow_generate_node) share: the LLM's
tokenizer as the node loads it, and every Scheduler of the process passing each token it appends
through a function first (which may change it, or wait)."""
from __future__ import annotations

from collections.abc import Callable

from pipeline.continuous.scheduler import Scheduler, SequenceState


def generator_tokenizer():
    """The LLM's tokenizer from the model source the node's environment names."""
    from transformers import AutoTokenizer

    from pipeline import spec
    from pipeline.config import Settings
    from pipeline.models import resolve_model_source
    return AutoTokenizer.from_pretrained(spec.GENERATOR_MODEL, **resolve_model_source(Settings.from_env()).hf_kwargs())


def before_each_token(choose: Callable[[SequenceState, int], int]) -> None:
    """Every Scheduler of this process appends `choose(seq, token)` in place of each token it appends."""
    append = Scheduler._append

    def chosen_append(self, seq, token, appended):
        append(self, seq, choose(seq, token), appended)

    Scheduler._append = chosen_append  # type: ignore[method-assign]
