"""The ``floe`` command line (``floe --help``); entry point ``floe.__main__:main``."""

from floe.cli import main

__all__ = ["main"]
