"""One's own knowledge base as a data version: ``python -m builders.ingest SOURCE... --out DATA/<version>``.

``sources`` expands the SOURCE arguments into files and reads each with its format's reader
(``text``: Markdown and plain text, ``html``, ``pdf``, ``records``: JSON lines and CSV) into
``documents.SourceDocument`` (a stable string id, title, URL, sections under their headings), or a
``documents.Skip`` naming why not; ``splitter`` cuts each document into passages counted in the
embedder's own tokens (``embedding``); ``build`` writes them as a full build, or with ``--from`` as the
next version of an earlier ingest through builders.incremental (only changed documents embedded).
"""
