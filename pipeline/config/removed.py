"""Variables this service no longer reads: a node started with one refuses to start and names what
replaced it, rather than ignoring a setting the operator believes is in force."""
from __future__ import annotations

from typing import Mapping

from pipeline.spec import MODEL_STAGES

# Old name -> the variable that carries its idea now. DTYPE and PRECISION were two settings for
# one idea (what a model computes in); PRECISION alone says it now.
REMOVED_VARIABLES = {"DTYPE": "PRECISION", **{f"{stage.upper()}_DTYPE": f"{stage.upper()}_PRECISION"
                                              for stage in MODEL_STAGES}}


def removed_variables(env: Mapping[str, str]) -> list[str]:
    """One problem per removed variable set in `env`, naming its replacement."""
    return [f"{name}={env[name]!r} is not read any more: set {new} instead (auto, float32, bfloat16, float16, "
            f"int8-dynamic, int8-weight or fast: what the model computes in)"
            for name, new in REMOVED_VARIABLES.items() if name in env]
