"""The one error a bad environment raises, and how a secret is shown."""
from __future__ import annotations

# What an entry point prints before each problem (and exits 2).
CONFIG_ERROR_PREFIX = "config error: "
# How a secret's value is shown anywhere it could be logged or served.
HIDDEN = "<hidden>"


class ConfigError(ValueError):
    """Bad environment values: one line per problem, meant for the operator (`problems`). Every entry
    point prints `f"config error: {exc}"`, so str() puts that prefix before each problem after the first."""

    def __init__(self, *problems: str):
        super().__init__(("\n" + CONFIG_ERROR_PREFIX).join(problems))
        self.problems = list(problems)
