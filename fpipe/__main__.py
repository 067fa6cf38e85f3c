"""``python -m fpipe`` runs the ``fpipe`` command."""

import sys

from fpipe.cli import main

if __name__ == "__main__":
    sys.exit(main())
