"""Offline tooling that builds what the service reads but never computes itself.

``builders.standins`` writes random-weight stand-ins of the five models as a
Hugging Face hub cache, ``builders.corpus`` generates the course and support
documents, and ``builders.data`` builds ``documents.db`` and its FAISS index in
the course or support layout. Every contract name (model names, labels, the
embedding dimension, the documents schema) is imported from ``pipeline.spec``,
and the repository root and stand-in home from ``pipeline.config``; nothing in
``pipeline/`` imports this package at module level (the one exception is
``pipeline.models``, which builds stand-ins lazily on first use).
"""
