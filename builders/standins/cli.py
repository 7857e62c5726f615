"""`python -m builders.standins --profile {tiny,faithful} [--hf-home DIR] [--seed N] [--force]`."""
from __future__ import annotations

import argparse
import logging
import pathlib
import time

from builders.standins.build import (
    BANNER,
    build_standins,
    default_standin_home,
    dir_size,
    is_built,
    read_marker,
    standin_env,
)
from builders.standins.profiles import PROFILES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m builders.standins",
        description="Build offline random-weight stand-ins of the service's five models into a HF hub cache.",
    )
    parser.add_argument("--profile", choices=PROFILES, default="tiny")
    parser.add_argument("--hf-home", type=pathlib.Path, default=None,
                        help="HF_HOME to write (default: .cache/standins/<profile> in the repo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if already built")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    hf_home = args.hf_home or default_standin_home(args.profile)
    already = not args.force and is_built(hf_home, args.profile, args.seed)
    started = time.perf_counter()
    hf_home = build_standins(args.profile, hf_home, seed=args.seed, force=args.force, progress=not args.quiet)
    elapsed = time.perf_counter() - started
    marker = read_marker(hf_home) or {}
    print(BANNER.strip("\n"))
    print(f"profile:   {args.profile} (seed {args.seed})" + ("  [already built, nothing to do]" if already else ""))
    print(f"hf_home:   {hf_home}")
    print(f"time:      {elapsed:.1f}s" + ("" if already else f" (build {marker.get('build_seconds', '?')}s)"))
    print(f"disk:      {dir_size(hf_home / 'hub') / 2**20:.1f} MiB")
    for key, info in marker.get("models", {}).items():
        print(f"  {key:<10} {info['repo']:<50} {info['parameters'] / 1e6:8.1f}M params")
    print("use:       " + " ".join(f"{k}={v}" for k, v in standin_env(hf_home).items()))
    return 0
