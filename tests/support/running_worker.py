"""A worker over the support build's documents, in this process: the request-path tests' subject."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pipeline.config import Settings
from pipeline.docstore import DocumentStore
from pipeline.stages import Stages
from services.roles.versioned_data import VersionedData
from services.roles.worker.request_path import Worker
from services.roles.worker.role import worker_config


@contextlib.contextmanager
def running_worker(support_data, stages: Stages, index, env: dict[str, str]) -> Iterator[Worker]:
    """A worker at `env`'s settings over the support build's documents, `index` answering its searches."""
    documents = VersionedData(support_data.db_path.parent, lambda directory, _: DocumentStore(directory / "documents"),
                              DocumentStore.close)
    documents.load_startup()
    worker = Worker(worker_config(Settings.from_env(env)), stages, index, documents)
    try:
        yield worker
    finally:
        worker.close(timeout=30)
        documents.close()
