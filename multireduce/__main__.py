"""``python -m multireduce``: see :mod:`multireduce._cli` for the subcommands and options."""

import sys

from ._cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
