"""Command line: `recstream demo` (and later `produce`, `serve`)."""
