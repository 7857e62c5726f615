"""Misspelt variables: a name that looks like ours but is not one is most likely a typo that
would otherwise be ignored in silence (the default applies and nobody notices)."""
from __future__ import annotations

import difflib
import os
from typing import Mapping

from pipeline.config.removed import REMOVED_VARIABLES
from pipeline.config.settings import Settings
from pipeline.spec import Stage

# Other software's variables that share a word with ours (HF_HOME beside HF_HUB_OFFLINE, TORCH_HOME
# beside TORCH_THREADS, HTTP_PROXY beside HTTP_READ_TIMEOUT_S): never "ours by the look of it".
FOREIGN_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "OTEL_", "PYTHON", "PYTEST",
                    "OMP_", "MKL_", "KMP_", "CUDA_", "NVIDIA_", "LC_", "XDG_", "SSH_", "GIT_", "HTTP_PROXY",
                    "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "LD_", "VIRTUAL_ENV", "CONDA_", "PIP_", "DEMO_DIR",
                    "DEMO_DOCS")
# How close (difflib ratio) an unknown name must be to one of ours to be called a typo of it;
# a foreign-looking name must be closer still (HF_HUB_OFLINE is, HF_HUB_CACHE is not).
TYPO_RATIO, FOREIGN_TYPO_RATIO = 0.8, 0.9


def _our_affixes() -> tuple[set[str], set[str]]:
    """The first word of each of our names ending in a stage or knob word (EMBED_, GATEWAY_...) and
    the endings several of ours share (_MAX_BATCH, _PRECISION, _TIMEOUT_S...)."""
    names = list(Settings.variables())
    prefixes = {name.split("_")[0] + "_" for name in names if "_" in name}
    # Words that are ours alone (NODE_ is not: Node.js has NODE_OPTIONS; a typo of NODE_1_IP is close anyway).
    prefixes &= {f"{stage.upper()}_" for stage in Stage} | {"GATEWAY_", "STANDIN_", "FAISS_", "LOCAL_",
                                                              "TRACING_", "RESPONSE_", "IDEMPOTENCY_",
                                                              "CLUSTER_", "SHUTDOWN_", "WAITRESS_"}
    endings = ("_MAX_BATCH", "_MAX_WAIT_MS", "_PRECISION", "_CACHE_SIZE")
    suffixes = {end for end in endings if sum(name.endswith(end) for name in names) >= 2}
    return prefixes, suffixes


def misspelt_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """One warning per variable in `env` that is not ours but looks like it, naming the closest of ours."""
    env = os.environ if env is None else env
    ours = list(Settings.variables())
    prefixes, suffixes = _our_affixes()
    warnings = []
    families = Settings.numbered_variables().values()
    for name in sorted(env):
        if name in ours or name in REMOVED_VARIABLES or not name.isupper():  # removed: Settings refuses it
            continue
        if any((match := fam["names"].fullmatch(name)) and int(match[1]) >= fam["first"] for fam in families):
            continue  # one of a numbered family (NODE_3_IP)
        foreign = name.startswith(FOREIGN_PREFIXES)
        close = difflib.get_close_matches(name, ours, n=1, cutoff=FOREIGN_TYPO_RATIO if foreign else TYPO_RATIO)
        if not close and not foreign:  # one of our words: the closest of ours sharing it
            kin = [our for our in ours if any(name.startswith(p) and our.startswith(p) for p in prefixes)
                   or any(name.endswith(x) and our.endswith(x) for x in suffixes)]
            close = difflib.get_close_matches(name, kin, n=1, cutoff=0.0)
        if close:
            warnings.append(f"{name} is not a setting this service reads (ignored); did you mean {close[0]}? "
                            "(env.example lists them all)")
    return warnings
