"""Compute stages on top of the hsk store: teacher, dump, train, sweep, and the `hsk` CLI."""
