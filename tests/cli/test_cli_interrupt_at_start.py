"""Ctrl-C in the first seconds of a command, while torch loads, ends in one line and status 130: the
package and its command line import no torch before the command line's interrupt handler is in place
(and ``--version`` answers without loading it)."""
import subprocess
import sys

# Ctrl-C arriving while torch is being imported, then the command as `python -m equikernels` runs it
INTERRUPTED_IMPORT = """
import runpy, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["equikernels", *ARGS]
runpy.run_module("equikernels", run_name="__main__")
"""


def _run(*args):
    code = f"ARGS = {list(args)!r}\n" + INTERRUPTED_IMPORT
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_ctrl_c_while_torch_loads_is_one_line():
    out = _run("settings")
    assert out.returncode == 130, out.stderr
    assert out.stderr == "equikernels: interrupted (SIGINT)\n"


def test_the_version_is_said_without_loading_torch():
    from equikernels import __version__

    out = _run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"equikernels {__version__}\n"


def test_the_command_line_module_imports_no_torch():
    check = "import sys, equikernels, equikernels.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
