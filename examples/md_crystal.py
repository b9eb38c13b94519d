"""Molecular dynamics of a small copper crystal (Langevin thermostat, 300 K) through ASE.

Uses the bundled default model (trained on EMT Cu, Ni, Al, Ag, Au, Pd, Pt) or ``--model``.

    python examples/md_crystal.py                     # CPU: 32 atoms, 20 steps, seconds
    python examples/md_crystal.py --repeat 6 --steps 1000 --device cuda
"""
import argparse

from ase.build import bulk

from equikernels.calculators import MACECalculator
from equikernels.calculators.md import MDSettings, run_md


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model file (default: the bundled model)")
    parser.add_argument("--repeat", type=int, default=2, help="cubic Cu cells per direction (4 atoms each)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default=None, help="directory for md.traj / md.log / summary.json")
    args = parser.parse_args()

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(args.repeat)
    print(f"{len(atoms)} Cu atoms, model: {args.model or 'the bundled default model'}")
    atoms.calc = MACECalculator(args.model, device=args.device)
    settings = MDSettings(steps=args.steps, timestep_fs=2.0, temperature_K=300.0, ensemble="nvt-langevin")
    summary = run_md(atoms, settings, out_dir=args.out)
    rate = f"{summary['ns_per_day']:.3f} ns/day" if summary["ns_per_day"] is not None else "no rate (< 2 steps)"
    print(f"final temperature {atoms.get_temperature():.0f} K, potential energy "
          f"{atoms.get_potential_energy() / len(atoms):.4f} eV/atom, {rate} on "
          f"{summary['device']}, {summary['neighbor_list_builds']} neighbour-list builds")


if __name__ == "__main__":
    main()
