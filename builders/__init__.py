"""Offline tooling that builds what the service reads but never computes itself.

``builders.standins`` writes random-weight stand-ins of the five models as a
Hugging Face hub cache (one module per model family), ``builders.corpus``
generates the course and support documents (one module of support topics per
category), and ``builders.data`` builds ``documents.db`` and its FAISS index in
the course or support layout (``build_files`` writes them crash-safely,
``ivf_writer`` streams the index). Every contract name (model names, labels, the
embedding dimension, the documents schema) is imported from ``pipeline.spec``,
and the repository root and stand-in home from ``pipeline.config``; nothing in
``pipeline/`` or ``services/`` imports this package (a serving node never builds).
"""
