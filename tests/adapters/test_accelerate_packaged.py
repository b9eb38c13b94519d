"""A model loaded from a torch.package archive (as nequip's packaged models are) holds the archive's own
copy of e3nn, whose classes are not the installed e3nn's: ``accelerate`` converts none of them and
lists each as left alone with that reason, rather than reporting nothing to do."""
import warnings

import torch

from equikernels import accelerate
from equikernels._compat import o3

EXTERN = ["torch.**", "sympy.**", "opt_einsum_fx.**", "opt_einsum.**", "numpy.**", "scipy.**", "mpmath.**",
          "packaging.**"]


def _packaged(model, tmp_path):
    from torch.package import PackageExporter, PackageImporter

    path = str(tmp_path / "model.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.package's own TypedStorage deprecation
        with PackageExporter(path) as exporter:
            exporter.intern("e3nn.**")
            exporter.extern(EXTERN)
            exporter.mock(["**"], exclude=["e3nn.**", *EXTERN])
            exporter.save_pickle("model", "model.pkl", model)
    return PackageImporter(path).load_pickle("model", "model.pkl")


def test_packaged_e3nn_modules_are_listed_as_left_alone(tmp_path):
    model = torch.nn.Sequential(o3.Linear("2x0e+1x1o", "2x0e+1x1o"),
                                o3.FullyConnectedTensorProduct("2x0e+1x1o", "1x0e+1x1o", "2x0e"))
    loaded = _packaged(model, tmp_path)
    assert type(loaded[0]).__module__.startswith("<torch_package_")
    x, y = torch.randn(5, 5), torch.randn(5, 4)
    before = loaded[1](loaded[0](x), y)
    report = accelerate(loaded)
    assert report.replaced == [] and [(n, t) for n, t, _ in report.left_alone] == [
        ("0", "Linear"), ("1", "FullyConnectedTensorProduct")]
    assert all("torch.package archive" in why for _, _, why in report.left_alone)
    assert "left 2 e3nn module(s) alone" in str(report)
    torch.testing.assert_close(loaded[1](loaded[0](x), y), before)
    root = _packaged(o3.Linear("2x0e", "2x0e"), tmp_path)
    assert [(n, t) for n, t, _ in accelerate(root).left_alone] == [("", "Linear")]
