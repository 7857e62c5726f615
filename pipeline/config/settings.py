"""Settings: the sections put together, built from the environment here and nowhere else.

`Settings.from_env()` parses every variable of every section; bad values raise one ConfigError with one
line per problem, all at once (each naming the variable, the value and what is accepted), then one line
per disagreement between values (pipeline.config.checks).
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import pipeline.config.sections as s
from pipeline.config.checks import disagreements
from pipeline.config.errors import HIDDEN, ConfigError
from pipeline.config.parsers import Address, render
from pipeline.config.removed import removed_variables
from pipeline.shards import shard_file_problems, shard_path
from pipeline.spec import MODEL_STAGES, Stage

REPO_ROOT = Path(__file__).resolve().parents[2]
# The <n> of a numbered variable (NODE_3_IP): a number without leading zeros.
NUMBER_PATTERN = r"(0|[1-9][0-9]*)"
# Derived HTTP read timeout (HTTP_READ_TIMEOUT_S=0): REQUEST_TIMEOUT_S / 30, within these bounds:
# long enough for a 32 MiB /search upload on a LAN, short enough that a slowloris socket
# holds a connection for seconds, not for the request timeout.
READ_TIMEOUT_SHARE, MIN_READ_TIMEOUT_S, MAX_READ_TIMEOUT_S = 30.0, 2.0, 30.0
# Derived connection limit (HTTP_CONNECTION_LIMIT=0): at least this many, or 4 per HTTP thread.
MIN_CONNECTION_LIMIT = 1024


# The rerank batch where RERANK_MAX_BATCH is empty, by device: on a CPU a rerank's cost follows its tokens, so a
# batch only delays its first request; on a GPU a batch's requests share its launches (docs/performance.md).
RERANK_MAX_BATCH_BY_DEVICE = {"cpu": 1, "cuda": 8}


@dataclass(frozen=True)
class BatchConfig:
    """What a stage's batching service is built with: its window and its queue bound."""
    max_batch: int  # <STAGE>_MAX_BATCH, or where it is empty the device's
    max_wait_ms: float
    max_queue: int


@dataclass(frozen=True)
class HttpServerConfig:
    """What one node's HTTP server is built with (derived from the HTTP, limits and cluster sections)."""
    threads: int
    read_timeout_s: float
    connection_limit: int
    channel_timeout_s: float
    max_body_bytes: int
    cluster_token: str


@dataclass(frozen=True)
class Settings(s.Sections):
    """The sections (sections.Sections), built from the environment, with their views and derived values."""

    # ----------------------------------------------------------------- building

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse every variable; ConfigError with one line per bad value, then per disagreement (all
        at once, so an operator fixes them in one round)."""
        env = os.environ if env is None else env
        problems: list[str] = removed_variables(env)
        unparsed: set[str] = set()
        sections = {}
        for section in dataclasses.fields(cls):
            section_type = section.metadata["section"]
            values = {}
            for f in dataclasses.fields(section_type):
                meta = f.metadata
                if "numbered" in meta:
                    values[f.name] = _numbered(meta, env, problems, unparsed)
                    continue
                raw = env.get(meta["env"])
                raw = meta["default"] if raw is None else raw
                try:
                    values[f.name] = meta["parse"](raw)
                except ValueError as exc:
                    shown = raw if f.repr else HIDDEN  # a secret's value never reaches a log
                    problems.append(f"{meta['env']}={shown!r} is not valid: expected {exc}")
                    unparsed.add(meta["env"])
                    # The default stands in, so the checks that do not read this variable can still run.
                    values[f.name] = meta["parse"](meta["default"])
            sections[section.name] = section_type(**values)
        settings = cls(**sections)
        problems += disagreements(settings, unparsed)
        if problems:
            raise ConfigError(*problems)
        return settings

    # ----------------------------------------------------------------- views

    @staticmethod
    def variables() -> dict[str, dict]:
        """Environment variable name -> {section, field, default, help}, in declaration order
        (the numbered families are in numbered_variables)."""
        return {f.metadata["env"]: {"section": section, "field": f.name, "default": f.metadata["default"],
                                    "help": f.metadata["help"]}
                for section, f in _variable_fields() if "numbered" not in f.metadata}

    @staticmethod
    def numbered_variables() -> dict[str, dict]:
        """Each family of numbered variables, by its documented name (NODE_<n>_IP) -> {section, field,
        help, names: a regex matching its variables (n >= its first)}."""
        return {f.metadata["env"]: {"section": section, "field": f.name, "help": f.metadata["help"],
                                    "first": f.metadata["first"],
                                    "names": re.compile(f.metadata["numbered"].format(n=NUMBER_PATTERN))}
                for section, f in _variable_fields() if "numbered" in f.metadata}

    @staticmethod
    def table() -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(section title, field metadata) for every variable, in declaration order: the one list
        env.example and the Kubernetes configmap are generated from (tools/render_settings.py)."""
        titles = {section.name: section.metadata["title"] for section in dataclasses.fields(Settings)}
        for section, f in _variable_fields():
            yield titles[section], f.metadata

    @staticmethod
    def default_of(name: str) -> str:
        """The default of one variable (NODE_3_IP too) as effective() shows it; KeyError if none."""
        for _, f in _variable_fields():
            meta = f.metadata
            if "numbered" not in meta and meta["env"] == name:
                return render(meta["parse"](meta["default"]))
            n = numbered_index(meta, name)
            if n is not None:
                return render(meta["parse"](meta["default_for"](n)))
        raise KeyError(name)

    def effective(self) -> dict[str, str]:
        """Environment variable name -> effective value as the string that sets it, in declaration
        order; a secret that is set reads "<hidden>" (what GET /settings and the startup line show)."""
        shown = {}
        for section, f in _variable_fields():
            value = getattr(getattr(self, section), f.name)
            if "numbered" in f.metadata:  # one entry per variable of the family that is set
                shown.update({f.metadata["numbered"].format(n=n): render(v) for n, v in value.items()})
                continue
            text = render(value)
            shown[f.metadata["env"]] = HIDDEN if text and not f.repr else text
        return shown

    def non_defaults(self) -> dict[str, str]:
        """effective() restricted to the variables whose value differs from their default."""
        return {name: value for name, value in self.effective().items() if value != Settings.default_of(name)}

    def node_address(self, node: int) -> Address:
        return self.cluster.node_address(node)

    def model_stage(self, stage: str) -> s.ModelStage:
        if stage not in MODEL_STAGES:
            raise KeyError(stage)
        section: s.ModelStage = getattr(self, str(stage))
        return section

    def batching(self, stage: str, device: str = "cpu") -> BatchConfig:
        """A batched stage's window and queue bound (a Stage, or its name; generate has no window) where it runs on
        `device` ("cpu" or "cuda"): an empty RERANK_MAX_BATCH is the device's (RERANK_MAX_BATCH_BY_DEVICE)."""
        if stage not in tuple(Stage) or stage == Stage.GENERATE:
            raise KeyError(stage)
        section: s.BatchWindow = getattr(self, str(stage))
        size = RERANK_MAX_BATCH_BY_DEVICE[device] if section.max_batch is None else section.max_batch
        return BatchConfig(size, section.max_wait_ms, self.limits.stage_max_queue)

    def stage_precision(self, stage: str) -> str:
        return self.model_stage(stage).precision or self.models.precision

    def stage_precision_variable(self, stage: str) -> str:
        return f"{stage.upper()}_PRECISION" if self.model_stage(stage).precision else "PRECISION"

    @property
    def read_timeout_s(self) -> float:
        """HTTP_READ_TIMEOUT_S, or derived from REQUEST_TIMEOUT_S (READ_TIMEOUT_SHARE) when 0."""
        if self.http.read_timeout_s:
            return self.http.read_timeout_s
        share = self.limits.request_timeout_s / READ_TIMEOUT_SHARE
        return min(MAX_READ_TIMEOUT_S, max(MIN_READ_TIMEOUT_S, share))

    def connection_limit(self, http_threads: int) -> int:
        """HTTP_CONNECTION_LIMIT, or derived from the node's HTTP threads when 0."""
        return self.http.connection_limit or max(MIN_CONNECTION_LIMIT, 4 * http_threads)

    def http_server(self, threads: int, max_body_bytes: int) -> HttpServerConfig:
        """The HTTP server's configuration for a node with `threads` HTTP threads."""
        return HttpServerConfig(threads, self.read_timeout_s, self.connection_limit(threads), self.channel_timeout_s,
                                max_body_bytes, self.cluster.cluster_token)

    @property
    def standin_dir(self) -> Path:
        return self.models.standin_home or (REPO_ROOT / ".cache" / "standins" / self.models.standin_profile)

    # ----------------------------------------------------------------- role checks

    def require_node_number(self) -> int:
        if self.cluster.node_number is None:
            raise ConfigError(f"NODE_NUMBER='' is not valid: expected an integer from 0 to "
                              f"{self.cluster.total_nodes - 1} (below TOTAL_NODES) to start a node")
        return self.cluster.node_number

    def index_file(self, node: int) -> Path:
        """The index file an index node serves: its shard's (pipeline.shards.shard_path)."""
        c = self.cluster
        return shard_path(self.index.faiss_index_path, c.served_shard(node), c.index_shards)

    def require_index_file(self, node: int) -> Path:
        """The index node's own shard file; ConfigError if it is missing, or if files of another shard
        count lie beside it (serving with the wrong INDEX_SHARDS would lose or repeat documents)."""
        c = self.cluster
        path = self.index_file(node)
        problems = [problem for problem in shard_file_problems(self.index.faiss_index_path, c.index_shards)
                    if str(path) in problem or "INDEX_SHARDS" in problem]
        return self._index_files_or_raise([path], problems)[0]

    def require_index_files(self) -> list[Path]:
        """Every shard's file, in shard order (one file when INDEX_SHARDS=1): for tools and the
        reference pipeline, which search the whole index in one process."""
        c = self.cluster
        paths = [shard_path(self.index.faiss_index_path, k, c.index_shards) for k in range(c.index_shards)]
        return self._index_files_or_raise(paths, shard_file_problems(self.index.faiss_index_path, c.index_shards))

    def _index_files_or_raise(self, paths: list[Path], problems: list[str]) -> list[Path]:
        if problems:
            where = f"FAISS_INDEX_PATH={str(self.index.faiss_index_path)!r}"
            if self.cluster.index_shards > 1:
                where += f" with INDEX_SHARDS={self.cluster.index_shards}"
            raise ConfigError(*(f"{where} is not valid: {problem}" for problem in problems))
        return paths

    def require_documents(self) -> Path:
        if not self.fetch.documents_db.is_file():
            raise ConfigError(f"DOCUMENTS_DIR={str(self.fetch.documents_dir)!r} is not valid: expected a folder "
                              "holding documents.db")
        return self.fetch.documents_db


def numbered_index(meta: Mapping[str, Any], name: str) -> int | None:
    """The n of `name` if it is a variable of the numbered family `meta` (fields.numbered) binds, else None."""
    match = "numbered" in meta and re.fullmatch(meta["numbered"].format(n=NUMBER_PATTERN), name)
    return int(match[1]) if match and int(match[1]) >= meta["first"] else None


def _numbered(meta: Mapping[str, Any], env: Mapping[str, str], problems: list[str], unparsed: set[str]) -> dict:
    """n -> parsed value of each variable of a numbered family set in env, in order of n."""
    values = {}
    members = sorted((n, name) for name in env if (n := numbered_index(meta, name)) is not None)
    for n, name in members:
        try:
            values[n] = meta["parse"](env[name])
        except ValueError as exc:
            problems.append(f"{name}={env[name]!r} is not valid: expected {exc}")
            unparsed.add(meta["env"])
    return values


def _variable_fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """(section name, field) for every variable, in declaration order."""
    for section in dataclasses.fields(Settings):
        for f in dataclasses.fields(section.metadata["section"]):
            yield section.name, f
