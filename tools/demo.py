"""`./run.sh demo`: the three nodes on 127.0.0.1 answering the client's eight queries."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable, Iterable

import client  # the top-level client.py, exactly as a user runs it
from pipeline import spec
from pipeline.config import REPO_ROOT, ConfigError, Settings
from pipeline.cpu_features import cpu_supports_bf16
from pipeline.device import describe_placement, select_device
from pipeline.precision_policy import CUDA, HARDWARE_WORDS, hardware_kind
from tools.local import LocalCluster, pinned_env


def machine_kind(only_cpu: bool, cpu_flags: Iterable[str] | None = None,
                 cuda_available: Callable[[], bool] | None = None) -> str:
    """This machine's row of the precision table, from its CPU's flags (/proc/cpuinfo's unless given)."""
    device = select_device(only_cpu) if cuda_available is None else select_device(only_cpu, cuda_available)
    return hardware_kind(device, lambda: cpu_supports_bf16(cpu_flags))


def precision_hint(settings: Settings, cpu_flags: Iterable[str] | None = None,
                   cuda_available: Callable[[], bool] | None = None) -> str | None:
    """The one line the demo prints about PRECISION=fast, unless it is already in use or computes what
    the default does (CUDA): what it trades, and that its gain was not measured on this kind of machine
    with this code (the AMX Xeon's 1.64x in docs/performance.md ran AMX's kernels, which oneDNN is held below)."""
    if settings.models.precision == "fast":
        return None
    kind = machine_kind(settings.models.only_cpu, cpu_flags, cuda_available)
    if kind == CUDA:
        return None
    here = HARDWARE_WORDS[kind]
    return (f"PRECISION=fast (opt-in) computes the LLM in int8, whose answers drift further from float32 "
            f"than bfloat16's; what it gains was not measured on {here} with this code (docs/performance.md "
            f"lists what was measured on which machine). This machine: {here}")


def precision_lines(settings: Settings) -> list[str]:
    """What each model stage will compute in on this machine (the nodes resolve it the same way)."""
    return [describe_placement(settings, stage) for stage in spec.MODEL_STAGES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--interval-s", type=float, default=0.5, help="seconds between the client's queries")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s demo %(levelname)s: %(message)s")
    try:
        env = pinned_env(os.environ)  # the nodes' environment
        cluster = LocalCluster(env, REPO_ROOT / "logs" / "demo")
        settings = Settings.from_env(env)
        lines = precision_lines(settings)
        hint = precision_hint(settings)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    logging.info("starting the three nodes (logs in %s)", cluster.log_dir)
    for line in lines:
        logging.info("computes %s", line)
    if hint:
        logging.info(hint)
    try:
        cluster.start()
        return client.main(["--url", cluster.url(0), "--interval", str(args.interval_s)])
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
