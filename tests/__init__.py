"""Core test-suite."""
