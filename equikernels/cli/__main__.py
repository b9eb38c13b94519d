"""``python -m equikernels.cli``: the ``equikernels`` command (used under ``torchrun``)."""
import sys

from . import main

sys.exit(main())
