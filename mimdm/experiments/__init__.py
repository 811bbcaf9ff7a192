"""Experiments behind the book chapters: each function is one measurement a chapter reports."""
