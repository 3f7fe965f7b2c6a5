"""The implementation of ``triton_python_backend_utils`` (which re-exports it), one concern per module."""
