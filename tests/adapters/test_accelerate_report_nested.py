"""The report of accelerate() lists, with the reason, every e3nn product, Linear or SphericalHarmonics it
keeps, also inside a kept e3nn module (e3nn's example networks are e3nn classes themselves)."""
import pytest

import equikernels as ek
from equikernels._compat import o3


class ScaledProduct(o3.FullyConnectedTensorProduct):
    def forward(self, x, y, weight=None):
        return super().forward(x, y, weight) * 2.0


def test_kept_product_inside_an_e3nn_network_is_listed():
    try:
        from e3nn.nn.models.gate_points_2101 import Network
    except ImportError as exc:  # e3nn 0.4.4's example network needs torch_cluster
        pytest.skip(f"e3nn's example network: {exc}")
    net = Network(irreps_in=None, irreps_hidden="4x0e+2x1o", irreps_out="0e", irreps_node_attr=None,
                  irreps_edge_attr="0e+1o", layers=1, max_radius=2.0, number_of_basis=3, radial_layers=1,
                  radial_neurons=4, num_neighbors=2.0, num_nodes=3.0)
    conv = net.layers[0].first
    conv.lin1 = ScaledProduct(conv.irreps_in, conv.irreps_node_attr, conv.irreps_in)
    report = ek.accelerate(net)
    why = {name: (t, w) for name, t, w in report.left_alone}
    reason = "ScaledProduct overrides forward(); its semantics are unknown"
    assert why["layers.0.first.lin1"] == ("ScaledProduct", reason)
    assert "layers.0.first.lin2" in report.replaced_names and "" in why, str(report)
    assert type(conv.lin1) is ScaledProduct
