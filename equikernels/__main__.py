"""``python -m equikernels``: the ``equikernels`` command."""
import sys

from .cli import main

sys.exit(main())
