"""Tooling that serves this repository only (page generation); not part of the attnres wheel."""
