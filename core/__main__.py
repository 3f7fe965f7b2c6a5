"""``python -m triton_serve``: the same as the ``triton-serve`` command."""
import sys

from ._engine.cli import main

sys.exit(main())
