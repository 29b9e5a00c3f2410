"""Small helpers every layer shares: value checks, atomic file writes, autocast, YAML settings files, machine
information, interleaved timing. Imports nothing of attnres outside this package."""
