"""The native node's compile command: the C++ standard torch's headers need (C++20 from torch 2.14,
whose headers refuse C++17), and a failed compile reported by the line that says why."""
from pathlib import Path

import pytest

from equikernels.ops import native


@pytest.mark.parametrize("version, standard", [("2.13.0+cpu", "c++17"), ("2.11.0+cu130", "c++17"),
                                               ("2.14.1+cu130", "c++20"), ("2.15.0.dev20270101", "c++20"),
                                               ("3.0.0", "c++20")])
def test_standard_follows_torch(version, standard):
    assert native.cxx_standard(version) == standard


def test_command_uses_the_installed_torchs_standard(monkeypatch):
    monkeypatch.setattr(native.torch, "__version__", "2.14.1")
    assert "-std=c++20" in native.build_command(Path("a.cpp"), Path("a.so"))
    monkeypatch.setattr(native.torch, "__version__", "2.13.0")
    assert "-std=c++17" in native.build_command(Path("a.cpp"), Path("a.so"))


def test_failed_compile_names_its_first_error():
    stderr = ("In file included from torch/all.h:1,\n"
              "torch/csrc/api/include/torch/all.h:5:2: error: #error C++20 or later compatible compiler is required\n"
              "    5 | #error C++20 ...\n" + "note: in expansion of macro\n" * 200)
    assert native.compiler_error(stderr) == ("torch/csrc/api/include/torch/all.h:5:2: error: #error C++20 or later "
                                             "compatible compiler is required")
    assert native.compiler_error("ld: cannot find -ltorch_python\n\n") == "ld: cannot find -ltorch_python"
    assert native.compiler_error("") == "no output"
