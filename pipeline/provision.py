"""Are the five real models in the Hugging Face cache? `python -m pipeline.provision` (`./run.sh models`)
names the command that fetches each missing one; exit 0 when all five are there (MODEL_SOURCE=hub can
start offline), 1 otherwise. Run it with the HF_HOME / HF_HUB_CACHE the nodes will have."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.models import ALL_MODELS, fetch_command, hub_cache_dir, missing_models


def report(cache_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """The lines to print about `cache_dir` (None: the default cache), and the models missing from it."""
    missing = missing_models(cache_dir)
    width = max(map(len, ALL_MODELS))
    where = f"{cache_dir} (--cache-dir)" if cache_dir else f"{hub_cache_dir()} (chosen by HF_HOME / HF_HUB_CACHE)"
    lines = [f"Hugging Face cache: {where}"]
    for name in ALL_MODELS:
        fetch = f"  fetch: {fetch_command(name, cache_dir)}" if name in missing else ""
        lines.append(f"  {'missing' if name in missing else 'present'}  {name.ljust(width)}{fetch}".rstrip())
    if missing:
        lines.append(f"{len(missing)} of {len(ALL_MODELS)} models missing; fetch them with (this machine must reach "
                     "the hub; or fetch elsewhere and copy the cache folder):")
        lines.extend(f"  {fetch_command(name, cache_dir)}" for name in missing)
        lines.append("or serve random-weight stand-ins instead: python -m builders.standins --profile tiny, "
                     "then MODEL_SOURCE=standin")
    else:
        lines.append(f"all {len(ALL_MODELS)} models present: MODEL_SOURCE=hub needs no download")
    return lines, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.provision",
                                     description="Check the Hugging Face cache for the five real models; "
                                                 "exit 0 when all are present, 1 otherwise.")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="the hub cache folder to check (default: huggingface_hub's, from HF_HOME / HF_HUB_CACHE)")
    args = parser.parse_args(argv)
    lines, missing = report(args.cache_dir)
    print("\n".join(lines))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
