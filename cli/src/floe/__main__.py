"""``python -m floe`` and the ``floe`` console script (``floe.__main__:main``)."""

from __future__ import annotations

import sys

from floe.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
