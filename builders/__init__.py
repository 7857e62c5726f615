"""Offline tooling that builds what the service reads but never computes itself.

``builders.standins`` writes random-weight stand-ins of the five models as a Hugging Face hub cache
(one module per model family), ``builders.corpus`` generates the course and support documents, and
``builders.data`` builds ``documents.db`` and its FAISS index (``build_files`` writes them
crash-safely, ``ivf_writer`` streams the index, ``mixture_vectors`` draws course vectors shaped like real
embeddings). Every contract name comes from ``pipeline.spec``;
nothing in ``pipeline/`` or ``services/`` imports this package (a serving node never builds).
"""
