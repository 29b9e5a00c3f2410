"""`attnres analyze`: load saved checkpoints and their held-out data, measure their depth statistics
(attnres.analysis), and write the report (attnres.report.depth_analysis_report)."""

from attnres.analyze.run_analysis import CheckpointAnalysis, analyze

__all__ = ["CheckpointAnalysis", "analyze"]
