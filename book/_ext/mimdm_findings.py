"""Sphinx extension of the book: fills the intro's findings table from the book's record (``book/results``) each
time the book is built, with `mimdm.app.findings.findings_markdown`, so the summary cannot drift from the chapters."""
from pathlib import Path

from mimdm.app.findings import findings_markdown

MARKER = "<!-- findings: filled at build time from book/results by book/_ext/mimdm_findings.py -->"


def _fill(app, docname, source):
    if MARKER in source[0]:
        source[0] = source[0].replace(MARKER, findings_markdown(Path(app.srcdir) / "book" / "results"))


def setup(app):
    app.connect("source-read", _fill)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
