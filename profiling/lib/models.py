"""A measuring tool's models as a worker would run them: settings from the environment, torch on
the worker's thread budget (TORCH_THREADS), the configured model source (stand-ins built if that is
what it names and they are missing: a tool may build them, a serving node may not); and the memory
they take."""
from __future__ import annotations

import logging
import re
import resource
from pathlib import Path

from builders.standins import source_building_standins
from pipeline.config import Settings
from pipeline.device import Placement, placement_for, thread_budget
from pipeline.generator import Generator
from pipeline.models import ModelSource

log = logging.getLogger(__name__)


def worker_settings() -> tuple[Settings, ModelSource]:
    """The environment's settings and model source, torch set to the threads a worker gives its models."""
    import torch
    settings = Settings.from_env()
    torch.set_num_threads(thread_budget(settings.models.torch_threads))
    return settings, source_building_standins(settings)


def worker_generator() -> tuple[Generator, ModelSource, Placement]:
    """The LLM placed as the service places it (device, dtype, precision), and where it came from."""
    settings, source = worker_settings()
    placement = placement_for(settings, "generate")
    return Generator.load(source, placement), source, placement


def model_class(stage: str) -> type:
    """The pipeline class that loads a model stage's model."""
    from pipeline.classifiers import SentimentClassifier, ToxicityClassifier
    from pipeline.embedder import Embedder
    from pipeline.reranker import Reranker
    return {"embed": Embedder, "rerank": Reranker, "generate": Generator, "sentiment": SentimentClassifier,
            "toxicity": ToxicityClassifier}[stage]


class MemoryProbe:
    """Peak and current RSS of this process.

    ru_maxrss only ever grows, so with `--stage all` every stage would report the
    largest model loaded before it. Linux can reset the peak (VmHWM) by writing 5
    to /proc/self/clear_refs; where that is refused we fall back to ru_maxrss and
    say so once."""

    def __init__(self):
        self.resettable = self.reset()
        if not self.resettable:
            log.info("cannot reset the peak RSS here; peaks are since the process started")

    @staticmethod
    def reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def peak_mib(self) -> float:
        try:
            status = Path("/proc/self/status").read_text() if self.resettable else ""
        except OSError:
            status = ""
        match = re.search(r"^VmHWM:\s+(\d+)\s+kB", status, re.MULTILINE)
        hwm_kib = int(match.group(1)) if match else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        return hwm_kib / 1024

    @staticmethod
    def current_mib() -> float:
        import psutil
        return psutil.Process().memory_info().rss / 2**20
