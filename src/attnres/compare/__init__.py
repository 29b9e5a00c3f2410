"""Comparison of residual variants: summary statistics and the written report."""

from attnres.compare.report import summarize, write_report

__all__ = ["summarize", "write_report"]
