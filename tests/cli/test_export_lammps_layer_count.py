"""`equikernels export-lammps`: the summary it prints counts the interaction layers in words that agree."""
import pytest

from equikernels.cli import main
from equikernels.models import save
from equikernels.models.builder import mace_config, random_model


@pytest.mark.parametrize("num_interactions, words", [(1, "1 interaction layer,"), (2, "2 interaction layers,")])
def test_summary_counts_the_layers(num_interactions, words, tmp_path, capsys):
    cfg = mace_config(r_max=3.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=1,
                      interaction="RealAgnosticResidualInteractionBlock",
                      interaction_first="RealAgnosticInteractionBlock", num_interactions=num_interactions,
                      atomic_numbers=[1, 8], hidden_irreps="4x0e+4x1o", MLP_irreps="4x0e", avg_num_neighbors=4.0,
                      correlation=2, radial_MLP=[8])
    model = tmp_path / "model.pt"
    save(random_model(cfg, seed=0), model)
    assert main(["export-lammps", str(model), str(tmp_path / "m.pkl")]) == 0
    assert words in capsys.readouterr().out.splitlines()[0]
