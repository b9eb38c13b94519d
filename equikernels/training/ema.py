"""Exponential moving average of the trainable parameters, evaluated in place of the raw weights."""
from __future__ import annotations

import contextlib
from typing import Dict, List

import torch


class EMA:
    def __init__(self, params: List[torch.nn.Parameter], decay: float):
        self.params = list(params)
        self.decay = float(decay)
        self.num_updates = 0
        self.shadow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        self.num_updates += 1
        # short warm-up so early averages are not dominated by the random start
        decay = min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
        for s, p in zip(self.shadow, self.params):
            s.lerp_(p.detach(), 1.0 - decay)

    @contextlib.contextmanager
    def average_parameters(self):
        """Swap the averaged weights in for the duration of the block."""
        backup = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, s in zip(self.params, self.shadow):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, b in zip(self.params, backup):
                    p.copy_(b)

    def state_dict(self) -> Dict:
        return {"decay": self.decay, "num_updates": self.num_updates,
                "shadow": [s.clone() for s in self.shadow]}

    def load_state_dict(self, state: Dict) -> None:
        if len(state["shadow"]) != len(self.shadow):
            raise ValueError(f"EMA state has {len(state['shadow'])} tensors, model has {len(self.shadow)} trainable parameters")
        self.decay = state["decay"]
        self.num_updates = state["num_updates"]
        for s, v in zip(self.shadow, state["shadow"]):
            s.copy_(v)
