"""Energy-conserving (NVE) molecular dynamics of an ethanol molecule, no periodic boundaries.

The bundled default model is trained on metals only, so without ``--model`` (a model that knows
H, C and O) this uses a small MACE with random weights: it shows the mechanics (the total energy
is conserved), not chemistry.

    python examples/md_molecule.py                    # CPU, 100 steps, seconds
    python examples/md_molecule.py --model my_organic.model --steps 5000
"""
import argparse

import numpy as np
from ase import units
from ase.build import molecule
from ase.md.verlet import VelocityVerlet

from equikernels.calculators import MACECalculator
from equikernels.calculators.md import initialise_velocities
from equikernels.calculators.random_models import example_model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--timestep", type=float, default=0.5, help="fs")
    parser.add_argument("--device", default=None)
    args = parser.parse_args()

    atoms = molecule("CH3CH2OH")
    model, description = example_model(atoms.numbers, args.model)
    print(f"ethanol, {description}")
    atoms.calc = MACECalculator(model, device=args.device, default_dtype="float64")
    initialise_velocities(atoms, 300.0, seed=0)
    dyn = VelocityVerlet(atoms, timestep=args.timestep * units.fs)
    energies = []
    dyn.attach(lambda: energies.append(atoms.get_total_energy()), interval=1)
    dyn.run(args.steps)
    energies = np.array(energies)
    print(f"{args.steps} steps of {args.timestep} fs: total energy {energies[0]:.6f} -> {energies[-1]:.6f} eV "
          f"(largest deviation {np.abs(energies - energies[0]).max():.2e} eV), final T {atoms.get_temperature():.0f} K")


if __name__ == "__main__":
    main()
