"""An interrupted suite run keeps the cells it finished, says so, and the CLI turns SIGTERM into that."""
import os
import signal
import time

import pytest
import torch

from equikernels.bench import suite
from equikernels.bench.report import markdown
from equikernels.cli.bench import interrupt_on_sigterm


def test_interrupted_run_keeps_finished_cells(monkeypatch):
    ran = []

    def tp(opts, device, cells):
        ran.append("tp")
        cells.append(suite._cell("tp/x/float32/16/fwd", "tp", "equikernels", "ok", ms=1.0))
        raise KeyboardInterrupt

    monkeypatch.setattr(suite, "run_tp", tp)
    monkeypatch.setattr(suite, "run_conv", lambda *a: ran.append("conv"))
    logs = []
    opts = suite.Options(groups=["tp", "conv"], target_ms=1.0, log=logs.append)
    data = suite.run_suite(opts, torch.device("cpu"))
    assert ran == ["tp"]
    assert [c["id"] for c in data["cells"]] == ["tp/x/float32/16/fwd"] and data["cells"][0]["host_us"] > 0
    assert data["interrupted"]["after_s"] >= 0 and "wall_s" in data
    assert any("interrupted" in line for line in logs)
    assert "Interrupted after" in markdown(data)


def test_a_complete_run_is_not_marked(monkeypatch):
    monkeypatch.setattr(suite, "run_tp", lambda opts, device, cells: None)
    data = suite.run_suite(suite.Options(groups=["tp"], log=lambda s: None), torch.device("cpu"))
    assert "interrupted" not in data and "Interrupted" not in markdown(data)


def test_sigterm_interrupts_the_block_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with interrupt_on_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this returns
    assert signal.getsignal(signal.SIGTERM) is before
