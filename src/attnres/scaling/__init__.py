"""Scaling laws: fits of loss against training compute with bootstrap intervals (docs/explanation/scaling-law.md);
the sweep that feeds them builds on `attnres.model.flops`."""
