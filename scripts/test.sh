#!/usr/bin/env bash
# Deprecated since attnres 0.3.0 (removed in 0.4.0): the repository's scripts moved under tools/.
echo "scripts/test.sh is deprecated since attnres 0.3.0 and will be removed in 0.4.0; use tools/test.sh" >&2
exec "$(dirname "${BASH_SOURCE[0]}")/../tools/test.sh" "$@"
