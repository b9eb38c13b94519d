"""The training loop: data, model, AdamW + schedule + EMA + clipping, evaluation, checkpoints with
exact resume, early stopping, DDP.

Exact resume: a checkpoint holds the model, optimiser, scheduler, EMA, best-model and
early-stopping state, the history, every RNG state, and the position in the epoch. The order of
structures in an epoch is a pure function of (seed, epoch), so a resumed run visits exactly the
batches the uninterrupted run would have, and reproduces it bit for bit wherever the model's own
arithmetic is deterministic (CPU; on CUDA, atomic scatter-adds differ in the last bits from run
to run, resumed or not)."""
from __future__ import annotations

import copy
import json
import math
import os
import random
import warnings
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from . import checkpoint as ckpt
from . import distributed as dist_utils
from . import model_factory as mf
from .config import TrainConfig
from .data import (Config, GraphDataset, build_dataset, check_labels, collate, read_configs,
                   split_train_valid)
from .ema import EMA
from .loss import error_sums, local_counts, loss_terms, metrics_from_sums, reduce_sums
from .statistics import avg_num_neighbors, average_e0s, parse_given_e0s, scale_shift

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def epoch_batches(n: int, batch_size: int, epoch: int, seed: int, rank: int = 0,
                  world: int = 1) -> List[List[int]]:
    """This rank's batches for one epoch. A global batch of ``batch_size * world`` structures is
    drawn from a permutation that depends only on (seed, epoch); rank r takes its r-th share."""
    perm = np.random.default_rng([seed, epoch]).permutation(n).tolist()
    step = batch_size * world
    out = []
    for start in range(0, n, step):
        chunk = perm[start:start + step]
        if len(chunk) < world:  # every rank must take part in every step (DDP)
            break
        out.append(np.array_split(np.array(chunk), world)[rank].tolist())
    return out


def forward(model, batch: Dict[str, torch.Tensor], *, training: bool, stress: bool):
    return model(dict(batch), training=training, compute_force=True, compute_stress=stress)


def backward_step(model, batch: Dict[str, torch.Tensor], cfg: TrainConfig):
    """Forward, loss and backward for one (local share of a) batch; gradients end up in .grad.
    Under DDP each process's gradients are averaged; the loss is scaled so that the average equals
    the gradient of the global-batch loss. Returns (global loss, its parts), detached."""
    counts = reduce_sums(local_counts(batch))
    out = forward(model, batch, training=True, stress=cfg.stress_weight > 0)
    loss, parts = loss_terms(out, batch, cfg, counts)
    (loss * dist_utils.world_size()).backward()
    stats = torch.stack([loss.detach()] + [p.detach() for p in parts.values()])
    stats = reduce_sums(stats)
    return float(stats[0]), {k: float(v) for k, v in zip(parts, stats[1:])}


class Trainer:
    """``Trainer(cfg).fit()``. ``configs`` lets Python callers pass structures instead of files."""

    def __init__(self, cfg: TrainConfig, *, train_configs: Optional[Sequence[Config]] = None,
                 valid_configs: Optional[Sequence[Config]] = None, log=print):
        if train_configs is not None and cfg.train_file is None:
            cfg = copy.deepcopy(cfg)
            cfg.train_file = "<in memory>"
        self.cfg = cfg.validate()
        self.log = log
        self.device = torch.device(cfg.device) if cfg.device else dist_utils.default_device()
        self.dist = dist_utils.setup(self.device)
        seed_everything(cfg.seed)
        self._load_data(train_configs, valid_configs)
        self._build_model()
        self._build_optimiser()
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.epoch_evaluated = False
        self.history: Dict[str, List] = {"train": [], "valid": []}
        self.best = {"loss": math.inf, "step": None, "state": None, "bad_evals": 0}
        self.stopped_early = False

    # ---- setup --------------------------------------------------------------------------------
    def _load_data(self, train_configs, valid_configs):
        cfg = self.cfg
        train = list(train_configs) if train_configs is not None else read_configs(cfg.train_file, cfg.keys)
        if valid_configs is not None:
            valid = list(valid_configs)
        elif cfg.valid_file:
            valid = read_configs(cfg.valid_file, cfg.keys)
        elif cfg.valid_fraction > 0:
            train, valid = split_train_valid(train, cfg.valid_fraction, cfg.seed)
        else:
            valid = []
        need = dict(need_energy=cfg.energy_weight > 0, need_forces=cfg.forces_weight > 0,
                    need_stress=cfg.stress_weight > 0)
        check_labels(train, cfg.train_file, **need)
        if valid:
            check_labels(valid, cfg.valid_file or cfg.train_file, **{**need, "need_stress": False})
        self.train_configs, self.valid_configs = train, valid

    def _build_model(self):
        cfg = self.cfg
        if cfg.model is not None:
            model = mf.load_model(cfg.model, cfg.model_backend)
            z_table = mf.atomic_numbers(model)
        else:
            zs = sorted({int(z) for c in self.train_configs + self.valid_configs for z in c.atomic_numbers})
            z_table, model = zs, None
        dtype = _DTYPES[cfg.dtype] if cfg.dtype else (mf.model_dtype(model) if model is not None else torch.float64)
        cutoff = mf.r_max(model) if model is not None else float((cfg.new_model or {}).get("r_max", mf.DEFAULT_NEW_MODEL["r_max"]))
        head_names = mf.heads(model) if model is not None else ["Default"]
        self.train_set = build_dataset(self.train_configs, z_table, cutoff, head_names)
        self.valid_set = build_dataset(self.valid_configs, z_table, cutoff, head_names)

        e0s = self._e0s(model, z_table)
        if model is None:
            e0_vec = np.array([e0s.get(z, 0.0) for z in z_table])
            scale, shift = scale_shift(self.train_configs, e0s)
            with _default_dtype(dtype):
                model = mf.build_new_model(cfg.new_model, z_table, e0_vec, avg_num_neighbors(self.train_set.graphs),
                                           scale, shift, head_names, cfg.model_backend)
        elif e0s:
            table = mf.get_e0s(model)
            for z, e in e0s.items():
                table[:, z_table.index(z)] = e
            mf.set_e0s(model, table)
        model = model.to(device=self.device, dtype=dtype)
        if cfg.freeze:
            frozen = mf.freeze(model, cfg.freeze)
            self._say(f"frozen {len(frozen)} parameter tensors ({', '.join(cfg.freeze)})")
        self.model, self.dtype = model, dtype
        self.params = [p for p in model.parameters() if p.requires_grad]
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DDP(model, device_ids=ids)
        else:
            self.ddp = model

    def _e0s(self, model, z_table) -> Dict[int, float]:
        """Elements -> E0 to write into the model ({} = keep the model's own)."""
        mode = self.cfg.e0s
        if isinstance(mode, dict):
            return parse_given_e0s(mode, z_table)
        if mode == "average" or model is None:  # a new model has no E0s to keep
            return average_e0s(self.train_configs, z_table)
        return {}

    def _build_optimiser(self):
        cfg = self.cfg
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.steps_per_epoch = len(epoch_batches(len(self.train_set), cfg.batch_size, 0, cfg.seed,
                                                 self.dist.rank, self.dist.world_size))
        if self.steps_per_epoch == 0:
            raise ValueError(f"{len(self.train_set)} training structure(s) cannot fill one step on "
                             f"{self.dist.world_size} process(es)")
        total = cfg.epochs * self.steps_per_epoch
        if cfg.lr_schedule == "plateau":
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer, factor=cfg.plateau_factor, patience=cfg.plateau_patience)
        else:
            def factor(step: int) -> float:
                if step < cfg.warmup_steps:
                    return (step + 1) / cfg.warmup_steps
                if cfg.lr_schedule == "constant":
                    return 1.0
                t = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
                return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.ema = EMA(self.params, cfg.ema_decay) if cfg.ema_decay else None

    # ---- state --------------------------------------------------------------------------------
    @property
    def ckpt_dir(self) -> str:
        return os.path.join(self.cfg.out_dir, "checkpoints")

    def state_dict(self) -> Dict:
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "ema": self.ema.state_dict() if self.ema else None,
            "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "epoch_evaluated": self.epoch_evaluated, "history": self.history, "best": self.best,
            "stopped_early": self.stopped_early, "rng": ckpt.rng_states(), "config": self.cfg.to_dict(),
            "world_size": self.dist.world_size,
        }

    def load_state_dict(self, state: Dict) -> None:
        if state["world_size"] != self.dist.world_size:
            raise ValueError(f"checkpoint was written by {state['world_size']} process(es); resuming with "
                             f"{self.dist.world_size} would change the data order")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        for key in ("step", "epoch", "batch_in_epoch", "epoch_evaluated", "history", "best", "stopped_early"):
            setattr(self, key, state[key])
        ckpt.set_rng_states(state["rng"])

    def save_checkpoint(self) -> None:
        if self.dist.is_main:
            ckpt.save(self.ckpt_dir, self.step, self.state_dict(), self.cfg.keep_checkpoints)
        dist_utils.barrier()

    def resume(self, path: Optional[str] = None) -> bool:
        """Continue from ``path`` or the newest checkpoint in out_dir; False when there is none."""
        path = path or ckpt.latest(self.ckpt_dir)
        if path is None:
            return False
        self.load_state_dict(ckpt.load(path))
        self._say(f"resumed from {path} (step {self.step}, epoch {self.epoch})")
        return True

    # ---- evaluation ---------------------------------------------------------------------------
    def evaluate(self, dataset: GraphDataset, batch_size: Optional[int] = None) -> Dict[str, float]:
        """RMSE/MAE over ``dataset`` with the current (EMA) weights, shared across processes."""
        sums = torch.zeros(3, 3, dtype=torch.float64, device=self.device)
        mine = list(range(self.dist.rank, len(dataset), self.dist.world_size))
        bs = batch_size or self.cfg.batch_size
        need_stress = any(dataset.graphs[i].stress_weight > 0 for i in mine)
        self.model.eval()
        for k in range(0, len(mine), bs):
            batch = collate([dataset.graphs[i] for i in mine[k:k + bs]], self.dtype, self.device)
            out = forward(self.model, batch, training=False, stress=need_stress)
            sums += error_sums(out, batch)
        self.model.train()
        result = metrics_from_sums(reduce_sums(sums))
        cfg = self.cfg
        result["loss"] = (cfg.energy_weight * result.get("rmse_energy_per_atom", 0.0) ** 2
                          + cfg.forces_weight * result.get("rmse_forces", 0.0) ** 2
                          + cfg.stress_weight * result.get("rmse_stress", 0.0) ** 2)
        return result

    def _ema_context(self):
        import contextlib

        return self.ema.average_parameters() if self.ema is not None else contextlib.nullcontext()

    def _end_of_epoch(self) -> None:
        cfg = self.cfg
        if not len(self.valid_set) or (self.epoch + 1) % cfg.eval_every_epochs:
            return
        with self._ema_context():
            metrics = self.evaluate(self.valid_set)
            improved = metrics["loss"] < self.best["loss"]
            if improved:
                self.best.update(loss=metrics["loss"], step=self.step, bad_evals=0,
                                 state={k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()})
        if not improved:
            self.best["bad_evals"] += 1
        if cfg.lr_schedule == "plateau":
            self.scheduler.step(metrics["loss"])
        self.history["valid"].append({"step": self.step, "epoch": self.epoch + 1, **metrics})
        self._say(f"epoch {self.epoch + 1}: " + _format_metrics(metrics))
        if cfg.patience is not None and self.best["bad_evals"] >= cfg.patience:
            self.stopped_early = True
            self._say(f"early stop: no improvement in {cfg.patience} evaluation(s)")

    # ---- the loop -----------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> Dict:
        from tqdm.auto import tqdm

        cfg = self.cfg
        if self.dist.is_main:
            os.makedirs(cfg.out_dir, exist_ok=True)
        if resume and not self.resume():
            self._say(f"no checkpoint in {self.ckpt_dir}; starting from the beginning")
        self.ddp.train()
        while self.epoch < cfg.epochs and not self.stopped_early and not self._budget_spent():
            batches = epoch_batches(len(self.train_set), cfg.batch_size, self.epoch, cfg.seed,
                                    self.dist.rank, self.dist.world_size)
            bar = tqdm(total=len(batches), initial=self.batch_in_epoch, desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
                       disable=not (cfg.progress and self.dist.is_main), leave=False, dynamic_ncols=True)
            while self.batch_in_epoch < len(batches) and not self._budget_spent():
                batch = collate([self.train_set.graphs[i] for i in batches[self.batch_in_epoch]], self.dtype, self.device)
                loss, parts = self._train_step(batch)
                self.batch_in_epoch += 1
                self.history["train"].append({"step": self.step, "epoch": self.epoch, "loss": loss,
                                              "lr": self.optimizer.param_groups[0]["lr"], **parts})
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4g}")
                if self.step % cfg.checkpoint_every == 0:
                    self.save_checkpoint()
            bar.close()
            if self.batch_in_epoch < len(batches):
                break  # max_steps reached mid-epoch
            if not self.epoch_evaluated:
                self._end_of_epoch()
                self.epoch_evaluated = True
            self.epoch += 1
            self.batch_in_epoch = 0
            self.epoch_evaluated = False
        self.save_checkpoint()
        return self._finish()

    def _budget_spent(self) -> bool:
        return self.cfg.max_steps is not None and self.step >= self.cfg.max_steps

    def _train_step(self, batch):
        cfg = self.cfg
        self.optimizer.zero_grad(set_to_none=True)
        loss, parts = backward_step(self.ddp, batch, cfg)
        if not math.isfinite(loss):
            raise FloatingPointError(f"training loss is {loss} at step {self.step + 1} (epoch {self.epoch + 1}); "
                                     "lower lr or check the data")
        if cfg.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, cfg.clip_grad_norm)
        self.optimizer.step()
        if cfg.lr_schedule != "plateau":
            self.scheduler.step()
        if self.ema is not None:
            self.ema.update()
        self.step += 1
        return loss, parts

    def load_final_weights(self) -> torch.nn.Module:
        """Put the weights to ship into the model, in place (training is over; continue a run
        with a new Trainer and ``resume``): the best validation weights when tracked, else the
        EMA weights, else the last ones. No copy of the model is made: some modules (e3nn's
        generated code, compiled kernels) do not survive deepcopy/pickling on every setup."""
        if self.cfg.save_best and self.best["state"] is not None:
            self.model.load_state_dict(self.best["state"])
        elif self.ema is not None:
            with torch.no_grad():
                for p, s in zip(self.ema.params, self.ema.shadow):
                    p.copy_(s)
        return self.model

    def _finish(self) -> Dict:
        cfg = self.cfg
        final = self.load_final_weights()
        summary = {"train": self.evaluate(self.train_set)}
        if len(self.valid_set):
            summary["valid"] = self.evaluate(self.valid_set)
        summary.update(step=self.step, epochs_completed=self.epoch, stopped_early=self.stopped_early,
                       best_step=self.best["step"])
        if self.dist.is_main:
            summary["model_path"] = mf.save_model(final, os.path.join(cfg.out_dir, "model.pt"))
            if not mf.is_ours(final):  # also keep it usable by mace-torch's own tools
                try:
                    summary["mace_model_path"] = mf.save_mace_torch(final, os.path.join(cfg.out_dir, "mace.model"))
                except Exception as exc:  # pickling whole modules is fragile; our format is the product
                    warnings.warn(f"could not also save the mace-torch model file: {exc}", stacklevel=2)
            with open(os.path.join(cfg.out_dir, "metrics.json"), "w") as fh:
                json.dump({"summary": summary, "history": self.history}, fh, indent=1)
            if cfg.plot and self.history["train"]:
                from .plot import plot_history

                summary["plot_path"] = plot_history(self.history, os.path.join(cfg.out_dir, "training.png"))
            self._say(metrics_table(summary))
        return summary

    def _say(self, msg: str) -> None:
        if self.dist.is_main and self.log is not None:
            self.log(msg)


class _default_dtype:
    """mace-torch builds its constants in the default dtype: build in the training dtype."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.old)


def _format_metrics(m: Dict[str, float]) -> str:
    parts = [f"loss {m['loss']:.4g}"]
    for prop, unit in (("energy_per_atom", "meV/atom"), ("forces", "meV/Å"), ("stress", "meV/Å³")):
        if f"rmse_{prop}" in m:
            parts.append(f"RMSE {prop} {1000 * m[f'rmse_{prop}']:.2f} {unit}")
    return ", ".join(parts)


def metrics_table(summary: Dict) -> str:
    cols = [("rmse_energy_per_atom", "RMSE E/atom"), ("mae_energy_per_atom", "MAE E/atom"),
            ("rmse_forces", "RMSE F"), ("mae_forces", "MAE F"), ("rmse_stress", "RMSE stress"),
            ("mae_stress", "MAE stress")]
    lines = ["final model (energies meV/atom, forces meV/Å, stress meV/Å³)",
             f"{'set':<6}" + "".join(f"{name:>14}" for _, name in cols)]
    for split in ("train", "valid"):
        if split in summary:
            m = summary[split]
            lines.append(f"{split:<6}" + "".join(
                f"{1000 * m[k]:>14.3f}" if k in m else f"{'-':>14}" for k, _ in cols))
    return "\n".join(lines)
