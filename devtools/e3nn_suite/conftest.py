"""Run e3nn's own o3 tests with equikernels' modules in place of e3nn's (not part of the package)."""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
import pytest  # noqa: E402

import equikernels.nn as enn  # noqa: E402  (imports e3nn safely first)
from e3nn import o3  # noqa: E402
from e3nn.util import test  # noqa: E402

ORIGINAL = {}
if os.environ.get("E3NN_ORIGINAL") != "1":
    for name in ("TensorProduct", "FullyConnectedTensorProduct", "ElementwiseTensorProduct", "FullTensorProduct",
                 "TensorSquare", "Linear"):
        if hasattr(o3, name) and hasattr(enn, name):
            ORIGINAL[name] = getattr(o3, name)
            setattr(o3, name, getattr(enn, name))

float_tolerance = test.float_tolerance


@pytest.fixture(autouse=True)
def set_random_seed() -> None:
    test.set_random_seeds()
