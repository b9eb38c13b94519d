"""Swap equikernels into an existing e3nn model.

Builds a small e3nn model (spherical harmonics -> fully connected tensor product -> linear), runs
it, then (1) converts one module with ``equikernels.from_e3nn`` and (2) converts the whole model in
place with ``equikernels.accelerate``, checking the outputs agree and timing both versions.

    python examples/swap_e3nn.py          # CPU: the CPU path, a few seconds (forward only: about e3nn's time)
    python examples/swap_e3nn.py --rows 100000 --repeat 20   # on a GPU: enough work to time the kernels
"""
import argparse
import time

import torch

import equikernels
from equikernels._compat import o3  # plain `from e3nn import o3` works too (e3nn >= 0.5 / torch < 2.6)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sh = o3.SphericalHarmonics("0e+1o+2e", normalize=True, normalization="component")
        self.tp = o3.FullyConnectedTensorProduct("16x0e+8x1o+4x2e", self.sh.irreps_out, "16x0e+8x1o+4x2e")
        self.linear = o3.Linear("16x0e+8x1o+4x2e", "8x0e+2x1o", biases=True)

    def forward(self, features, vectors):
        return self.linear(self.tp(features, self.sh(vectors)))


def timed(fn, repeat=5, warmup=3):
    # warm-up: builds the path tables / kernels once; e3nn's TorchScript modules also optimise
    # themselves during their first two calls, which would otherwise dominate e3nn's time
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    return out, (time.perf_counter() - start) / repeat * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000, help="inputs (rows) per forward")
    parser.add_argument("--repeat", type=int, default=5, help="timed forwards per version")
    args = parser.parse_args()
    if args.rows < 1 or args.repeat < 1:
        parser.error(f"--rows and --repeat must be positive integers, got {args.rows} and {args.repeat}")

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Model().to(device)
    features = o3.Irreps("16x0e+8x1o+4x2e").randn(args.rows, -1, device=device)
    vectors = torch.randn(args.rows, 3, device=device)

    with torch.no_grad():
        ref, t_e3nn = timed(lambda: model(features, vectors), args.repeat)

        # (1) one module: the converted module holds the very same weight Parameter
        tp = equikernels.from_e3nn(model.tp)
        assert tp.weight is model.tp.weight
        print(f"from_e3nn: e3nn's {model.tp}\n  -> equikernels.{type(tp).__name__}, holding the same weight Parameter")
        diff_tp = (tp(features, model.sh(vectors)) - model.tp(features, model.sh(vectors))).abs().max().item()
        print(f"  max |difference| of the tensor product: {diff_tp:.2e}")

        # (2) the whole model, in place; state_dict keys and values are unchanged
        state = {k: v.clone() for k, v in model.state_dict().items()}
        report = equikernels.accelerate(model)
        print(report)
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
        out, t_ek = timed(lambda: model(features, vectors), args.repeat)

    print(f"max |difference| of the model output: {(out - ref).abs().max().item():.2e} "
          f"(relative {((out - ref).norm() / ref.norm()).item():.1e})")
    backend = "Triton kernels" if device == "cuda" else "CPU path (e3nn's tensor product or dense contractions)"
    print(f"time per forward on {device}: e3nn {t_e3nn:.2f} ms, equikernels {t_ek:.2f} ms [{backend}]")


if __name__ == "__main__":
    main()
