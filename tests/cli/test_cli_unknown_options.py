"""An option a command does not have: argparse's error with the usage of that command (not the top
level's) and the nearest option the command has, when one is near."""
import pytest

from equikernels.cli import main


@pytest.mark.parametrize("argv, usage, message", [
    (["md", "--stpes", "3"], "usage: equikernels md ", "equikernels md: error: unrecognized arguments: --stpes "
                                                      "(did you mean --steps?)"),
    (["fine-tune", "--epohcs=1"], "usage: equikernels fine-tune ",
     "equikernels fine-tune: error: unrecognized arguments: --epohcs=1 (did you mean --epochs?)"),
    (["eval", "x.xyz", "--zzzz"], "usage: equikernels eval ", "equikernels eval: error: unrecognized arguments: --zzzz"),
    (["--bogus"], "usage: equikernels ", "equikernels: error: unrecognized arguments: --bogus"),
    (["eval", "run/model.pt", "x.xyz"], "usage: equikernels eval ", "equikernels eval: error: unrecognized arguments: "
     "x.xyz (the model is given with --model: equikernels eval --model run/model.pt x.xyz)"),
    (["md", "MACE.model", "cu.cif"], "usage: equikernels md ", "equikernels md: error: unrecognized arguments: "
     "cu.cif (the model is given with --model: equikernels md --model MACE.model cu.cif)"),
    (["eval", "a.xyz", "b.xyz"], "usage: equikernels eval ", "equikernels eval: error: unrecognized arguments: b.xyz"),
])
def test_unknown_option_names_the_command_and_the_nearest_option(capsys, argv, usage, message):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(usage), err
    assert err[-1] == message, err


def test_md_takes_dt_for_the_timestep():
    # --dt, MD's usual name, is the timestep (as a prefix it was taken for --dtype)
    from equikernels.cli import build_parser

    args = build_parser().parse_args(["md", "--dt", "0.5"])
    assert args.timestep == 0.5 and args.dtype is None
