"""Document generators: the course corpus (``course``) and a realistic customer-support corpus
(``support``: help-centre articles about returns, refunds, shipping, billing, warranty, accounts and
troubleshooting, their text in ``articles/``, one JSON file of topics per category)."""
from builders.corpus.course import CATEGORIES, course_document
from builders.corpus.support import support_documents

__all__ = ["CATEGORIES", "course_document", "support_documents"]
