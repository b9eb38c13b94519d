"""Shared check of the command-line tests."""


def one_line_error(capsys, *needles):
    """The captured stderr is one line holding every needle, with no traceback; returns the line."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def sigterm_after_step(monkeypatch, step):
    """This process receives SIGTERM once ``equikernels md`` has finished ``step``."""
    import os
    import signal

    from equikernels.calculators import md as md_module

    real = md_module._Progress.__call__

    def terminate(self):
        real(self)
        if self.steps_done == step:
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(md_module._Progress, "__call__", terminate)
