"""Energy-conserving (NVE) molecular dynamics of a Cu-Ni nanoparticle, no periodic boundaries.

A 55-atom icosahedron with a quarter of its atoms turned to Ni, with the bundled default model
(trained on EMT Cu, Ni, Al, Ag, Au, Pd, Pt) or ``--model``; the total energy stays constant.

    python examples/md_cluster.py                     # CPU, 100 steps, seconds
    python examples/md_cluster.py --model my.model --steps 5000
"""
import argparse

import numpy as np
from ase import units
from ase.cluster import Icosahedron
from ase.md.verlet import VelocityVerlet

from equikernels.calculators import MACECalculator
from equikernels.calculators.md import initialise_velocities


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model file (default: the bundled model)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--timestep", type=float, default=2.0, help="fs")
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    if args.steps < 0:
        parser.error(f"--steps must be a non-negative integer, got {args.steps}")
    if not args.timestep > 0:
        parser.error(f"--timestep must be a positive number of fs, got {args.timestep}")

    atoms = Icosahedron("Cu", noshells=3, latticeconstant=3.61)
    rng = np.random.default_rng(0)
    atoms.numbers[rng.choice(len(atoms), size=len(atoms) // 4, replace=False)] = 28  # Ni
    atoms.calc = MACECalculator(args.model, device=args.device, default_dtype="float64")
    initialise_velocities(atoms, 300.0, seed=0)
    dyn = VelocityVerlet(atoms, timestep=args.timestep * units.fs)
    energies = []
    dyn.attach(lambda: energies.append(atoms.get_total_energy()), interval=1)
    dyn.run(args.steps)
    energies = np.array(energies)
    print(f"{atoms.get_chemical_formula()} nanoparticle, {args.steps} steps of {args.timestep} fs: total energy "
          f"{energies[0]:.6f} -> {energies[-1]:.6f} eV (largest deviation "
          f"{np.abs(energies - energies[0]).max():.2e} eV), final T {atoms.get_temperature():.0f} K")


if __name__ == "__main__":
    main()
