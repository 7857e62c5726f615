"""A measuring tool's models as a worker would run them: settings from the environment, torch on
the worker's thread budget (TORCH_THREADS), the configured model source (stand-ins built if that is
what it names and they are missing: a tool may build them, a serving node may not)."""
from __future__ import annotations

from builders.standins import source_building_standins
from pipeline.config import Settings
from pipeline.device import Placement, placement_for, thread_budget
from pipeline.generator import Generator
from pipeline.models import ModelSource


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
