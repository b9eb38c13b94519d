"""EMT-labelled structures for the training tests, from ``examples/emt_data.py``: the generator of
the bundled model's data, loaded by path so that the tests and the example share one copy."""
import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "examples" / "emt_data.py"
_spec = importlib.util.spec_from_file_location("emt_data_example", _PATH)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

EMT_ELEMENTS = _module.EMT_ELEMENTS
emt_structures = _module.emt_structures
write_emt_dataset = _module.write_emt_dataset
