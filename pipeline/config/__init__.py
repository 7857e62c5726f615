"""Configuration: one typed, immutable object built from the environment, here only, in sections.

`Settings` (settings.py) holds one section per component (sections.py); each field is bound to one
environment variable with its parser, default and help (fields.py, parsers.py). env.example and
deploy/k8s/settings.env are generated from Settings.table() (`python -m tools.render_settings --write`).
"""
from pipeline.config.errors import CONFIG_ERROR_PREFIX, HIDDEN, ConfigError
from pipeline.config.parsers import (
           CUDA_ONLY_VARIANTS,
           PRECISION_CHOICES,
           PRECISION_POLICIES,
           PRECISION_VARIANTS,
           Address,
)
from pipeline.config.settings import REPO_ROOT, BatchConfig, HttpServerConfig, Settings

__all__ = ["CONFIG_ERROR_PREFIX", "CUDA_ONLY_VARIANTS", "HIDDEN", "PRECISION_CHOICES", "PRECISION_POLICIES",
           "PRECISION_VARIANTS", "REPO_ROOT", "Address", "BatchConfig", "ConfigError", "HttpServerConfig", "Settings"]
