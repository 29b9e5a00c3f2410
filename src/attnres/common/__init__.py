"""Small helpers every layer shares: value checks, atomic file writes, autocast. Imports nothing of attnres."""
