"""Tests of attnres.bench."""
