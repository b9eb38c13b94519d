"""Geometry optimisation: relax the atoms and the cell of a strained, rattled copper crystal with
ASE's BFGS and FrechetCellFilter (forces and stress from the calculator), then a Cu(111) slab.

    python examples/geometry_optimisation.py          # CPU, seconds
    python examples/geometry_optimisation.py --model my.model
    python examples/geometry_optimisation.py --steps 3  # a quick look: 3 BFGS steps per relaxation
"""
import argparse

import numpy as np
from ase.build import bulk, fcc111
from ase.filters import FrechetCellFilter
from ase.optimize import BFGS

from equikernels.calculators import MACECalculator


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model file (default: the bundled model)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--fmax", type=float, default=0.01, help="force convergence, eV/A")
    parser.add_argument("--steps", type=int, default=300, help="most BFGS steps per relaxation")
    args = parser.parse_args()
    if args.steps < 0:
        parser.error(f"--steps must be a non-negative integer, got {args.steps}")
    if not args.fmax > 0:
        parser.error(f"--fmax must be a positive force in eV/A, got {args.fmax}")

    crystal = bulk("Cu", "fcc", a=3.75, cubic=True).repeat(2)  # 4 % too large, and rattled
    crystal.rattle(0.05, seed=0)
    print(f"model: {args.model or 'the bundled default model'}")
    calc = MACECalculator(args.model, device=args.device, default_dtype="float64")

    crystal.calc = calc
    e0 = crystal.get_potential_energy()
    opt = BFGS(FrechetCellFilter(crystal), logfile=None)
    opt.run(fmax=args.fmax, steps=args.steps)
    a = np.cbrt(crystal.get_volume() / len(crystal) * 4)
    print(f"bulk: {opt.nsteps} BFGS steps, energy {e0:.4f} -> {crystal.get_potential_energy():.4f} eV, "
          f"lattice constant 3.750 -> {a:.3f} A, "
          f"max force {np.abs(crystal.get_forces()).max():.4f} eV/A, "
          f"max stress {np.abs(crystal.get_stress()).max():.2e} eV/A^3")

    slab = fcc111("Cu", (2, 2, 4), a=a, vacuum=6.0)  # periodic in x, y only
    slab.pbc = [True, True, False]
    z0 = slab.positions[:, 2].copy()
    slab.rattle(0.05, seed=1)
    slab.calc = calc
    opt = BFGS(slab, logfile=None)
    opt.run(fmax=args.fmax, steps=args.steps)
    top = z0 > z0.max() - 0.1
    print(f"Cu(111) slab: {opt.nsteps} BFGS steps, top layer moved {np.mean(slab.positions[top, 2] - z0[top]):+.3f} A, "
          f"max force {np.abs(slab.get_forces()).max():.4f} eV/A")


if __name__ == "__main__":
    main()
