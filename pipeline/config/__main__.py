"""`python -m pipeline.config` (`./run.sh settings`): every setting's effective value and whether
it is the default, then what each model stage computes in on this machine (resolved as a node
resolves it, without loading a model), then the data version FAISS_INDEX_PATH lies in (its index, sharding
and the recall@10 its build measured per shard); a warning per misspelt variable; exit 2 listing every
bad value."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping

from pipeline.config.errors import CONFIG_ERROR_PREFIX, ConfigError
from pipeline.config.settings import Settings
from pipeline.config.typos import misspelt_variables
from pipeline.spec import MODEL_STAGES


def describe(settings: Settings, env: Mapping[str, str]) -> list[str]:
    """One line per variable: NAME=effective value, and whether that is the default."""
    lines = []
    for name, value in settings.effective().items():
        default = Settings.default_of(name)
        if value == default:
            origin = "default" if name not in env else "set, equal to the default"
        else:
            origin = f"set (default: {default or 'empty'})"
        lines.append(f"{name}={value}".ljust(48) + f"  # {origin}")
    return lines


def describe_data_version(settings: Settings) -> list[str]:
    """The version FAISS_INDEX_PATH lies in, as its manifest says: what an operator checks before serving it."""
    from pipeline.data_version import DataVersionError, load_version, version_dir_of
    version_dir = version_dir_of(settings.index.faiss_index_path)
    try:
        manifest = load_version(version_dir)
    except DataVersionError as exc:
        return [f"# no data version at FAISS_INDEX_PATH's folder {version_dir}: {exc}"]
    index = manifest.index
    recall = index.get("recall") or {}
    sharding = manifest.sharding.get("kind", "centroid") if manifest.sharding else "hash (doc_id % shards)"
    lines = [f"# data version {manifest.version} ({manifest.kind}, {manifest.documents} documents) in {version_dir}:",
             f"#   index {index.get('spec', index.get('kind', 'IVF-Flat'))}, {manifest.shards} shard(s), "
             f"sharding {sharding}, embedder {manifest.embedder.model} ({manifest.embedder.dim} dims)"]
    if recall:
        params = ", ".join(f"{k} {v}" for k, v in (recall.get("params") or {}).items()) or "its build's parameters"
        shards = " ".join(f"{n}:{r:.4f}" for n, r in enumerate(recall.get("shards") or []))
        floor = recall.get("floor")
        lines.append(f"#   recall@{recall.get('at', 10)} {recall.get('overall', float('nan')):.4f} overall at {params}"
                     f" on {recall.get('queries')} queries; per shard {shards or '-'}"
                     + (f"; floor {floor:g}" + (" (accepted below it)" if recall.get("accepted_below_floor") else "")
                        if floor is not None else ""))
    else:
        lines.append("#   recall@10 not measured (a build before recall was recorded)")
    return lines


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.config` (`./run.sh settings`): the effective settings; exit 2 on bad values."""
    from pipeline.device import describe_placement  # pipeline.device reads pipeline.config: not at import
    parser = argparse.ArgumentParser(prog="python -m pipeline.config", description=main.__doc__)
    parser.add_argument("--non-default", action="store_true", help="only the variables not at their default")
    args = parser.parse_args(argv)
    for warning in misspelt_variables():
        print(f"warning: {warning}", file=sys.stderr)
    try:
        settings = Settings.from_env()
        # "# embed: bfloat16 (PRECISION=auto on a CPU with avx512_bf16 (or AMX, held below it))", one per model stage;
        # a variant this device cannot run is a ConfigError, as a node would refuse to start too.
        resolved = [f"# {describe_placement(settings, stage)}" for stage in MODEL_STAGES]
    except ConfigError as exc:
        print(f"{CONFIG_ERROR_PREFIX}{exc}", file=sys.stderr)
        return 2
    lines = describe(settings, os.environ)
    if args.non_default:
        lines = [line for line in lines if "# set (default" in line] or ["# every setting is at its default"]
    if not args.non_default:
        lines += ["# what each model stage computes in here:", *resolved, *describe_data_version(settings)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
