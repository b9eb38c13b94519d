"""The words a switch's value may be on the command line (mace-torch's str2bool words), for
``fine-tune``'s mace-torch switches (``--multiheads_finetuning=False``) and ``eval``'s
``--descriptor_invariants_only false``."""
from __future__ import annotations

from typing import Optional

WORDS = {"true": True, "t": True, "yes": True, "y": True, "1": True,
         "false": False, "f": False, "no": False, "n": False, "0": False}


def switch_value(text: str) -> Optional[bool]:
    """``text`` as a switch's value, or None where it is none of ``WORDS``."""
    return WORDS.get(text.strip().lower())
