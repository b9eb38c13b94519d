"""The report of accelerate() lists, with the reason, every e3nn product, Linear or SphericalHarmonics it
keeps, also inside a kept e3nn module (e3nn's example networks are e3nn classes themselves)."""
import equikernels as ek
from equikernels._compat import o3
from problems import e3nn_example_network


class ScaledProduct(o3.FullyConnectedTensorProduct):
    def forward(self, x, y, weight=None):
        return super().forward(x, y, weight) * 2.0


def test_kept_product_inside_an_e3nn_network_is_listed():
    net = e3nn_example_network()
    conv = net.layers[0].first
    conv.lin1 = ScaledProduct(conv.irreps_in, conv.irreps_node_attr, conv.irreps_in)
    report = ek.accelerate(net)
    why = {name: (t, w) for name, t, w in report.left_alone}
    reason = "ScaledProduct overrides forward(); its semantics are unknown"
    assert why["layers.0.first.lin1"] == ("ScaledProduct", reason)
    assert "layers.0.first.lin2" in report.replaced_names and "" in why, str(report)
    assert type(conv.lin1) is ScaledProduct
