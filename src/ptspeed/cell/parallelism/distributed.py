"""One process (rank) of a ddp/fsdp cell, started by torchrun (see :mod:`ptspeed.launch.torchrun`).

Each rank runs the ordinary harness (:func:`ptspeed.cell.harness.run_cell`) with a :class:`Rank`
placement: device ``cuda:LOCAL_RANK`` with NCCL, or the CPU with gloo and its share of the
cell's threads; the model wrapped in DistributedDataParallel or FullyShardedDataParallel after
its FLOPs are counted; a barrier before the first step and before the measured loop; and the
measured wall time taken from the slowest rank, so that the throughput is the global one.

Every rank builds the same weights and trains on the same seeded batch: the averaged gradient
equals each rank's own, so the losses are those of single-process eager, and rank 0 checks
them against it with the ordinary numerics gate. Only rank 0's record becomes the cell's
(unless a rank fails); the injected faults ``rank-error`` and ``rank-crash`` hit the last
rank only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ptspeed.cell.harness import SingleProcess, resolve_device
from ptspeed.cell.measurement.reference import host_copy
from ptspeed.cell.measurement.telemetry import throttle_bits, throttle_names
from ptspeed.cell.record import CellSpec
from ptspeed.cell.record_window import Conditions, Metrics
from ptspeed.cell.variants.knobs import Knobs, parse_knobs, threads_per_process
from ptspeed.errors import Unsupported

RANK_FAULT_PREFIX = "rank-"


class Rank(SingleProcess):
    """This process as rank ``rank`` of ``world_size`` (torchrun's RANK, LOCAL_RANK, WORLD_SIZE)."""

    def __init__(self, knobs: Knobs, rank: int, local_rank: int, world_size: int, timeout_s: float):
        self.knobs = knobs
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.backend = ""
        self.reports = rank == 0
        self._collective_device = torch.device("cpu")
        self.wrap_policy = ""

    @classmethod
    def from_environment(cls, spec: CellSpec) -> Rank:
        knobs = parse_knobs(spec.knobs)
        world_size = int(os.environ["WORLD_SIZE"])
        if world_size != knobs.world_size:
            raise RuntimeError(f"torchrun started {world_size} ranks, the knobs ask for {knobs}")
        rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        return cls(knobs, rank, local_rank, world_size, spec.timeout_s)

    def device(self, requested: str) -> torch.device:
        device = resolve_device(requested)
        if device.type == "cuda":
            visible = torch.cuda.device_count()
            if visible < self.world_size:
                raise Unsupported(
                    f"{self.knobs.parallel} with {self.world_size} processes needs "
                    f"{self.world_size} GPUs (one per process); this cell sees {visible}"
                )
            device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(device)
            self._collective_device = device
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        # A backstop: a lost peer ends gloo's collectives at once and torchrun ends the ranks
        # of a failed one; a hung rank is the watchdog's (the cell's time limit).
        timeout = timedelta(seconds=self.timeout_s)
        dist.init_process_group(self.backend, timeout=timeout)
        return device

    def threads(self, requested: int) -> int:
        return threads_per_process(requested, self.world_size)

    def fault(self, fault: str) -> str:
        if not fault.startswith(RANK_FAULT_PREFIX):
            return fault
        last = self.rank == self.world_size - 1
        return fault[len(RANK_FAULT_PREFIX) :] if last else ""

    def wrap(
        self, model: Any, knobs: Knobs, device: torch.device, blocks: tuple[str, ...] = ()
    ) -> tuple[Any, Knobs]:
        # Memory format first: FSDP flattens the parameters, and converting them afterwards
        # would cut use_orig_params' views loose from the flat parameter.
        if knobs.channels_last:
            model = model.to(memory_format=torch.channels_last)
        step_knobs = dataclasses.replace(knobs, channels_last=False)
        if knobs.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [device.index] if device.type == "cuda" else None
            return DistributedDataParallel(model, device_ids=device_ids), step_knobs
        return self._fsdp(model, knobs, device, blocks), step_knobs

    def _fsdp(self, model: Any, knobs: Knobs, device: torch.device, blocks: tuple[str, ...]) -> Any:
        from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        block_types = {type(m) for m in model.modules() if type(m).__name__ in blocks}
        options: dict[str, Any] = {"device_id": device}
        if block_types:
            # Each block its own unit, as the torch version's own auto-wrap policy does for
            # transformer layers: parameters gathered block by block, overlapping compute.
            options["auto_wrap_policy"] = functools.partial(
                transformer_auto_wrap_policy, transformer_layer_cls=block_types
            )
        if knobs.cpu_offload:
            # Offloaded parameters live on the host; FSDP shards them on device_id.
            model = model.to("cpu")
            options["cpu_offload"] = CPUOffload(offload_params=True)
        if knobs.compile_mode is not None:
            options["use_orig_params"] = True  # what torch.compile of an FSDP module needs
        wrapped = FullyShardedDataParallel(model, **options)
        units = len(FullyShardedDataParallel.fsdp_modules(wrapped))
        names = ", ".join(sorted(t.__name__ for t in block_types)) or "none found"
        self.wrap_policy = f"transformer_auto_wrap_policy per block: {names} ({units} units)"
        return wrapped

    def full_state(self, model: Any) -> dict[str, Any]:
        """The whole model's state on rank 0 ({} elsewhere); under FSDP a collective, so every
        rank calls it."""
        if self.knobs.parallel == "fsdp":
            from torch.distributed.fsdp import FullStateDictConfig, StateDictType
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            whole = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, whole):
                state = model.state_dict()
            return host_copy(state.items()) if self.reports else {}
        return super().full_state(model.module) if self.reports else {}

    def gradients(self, model: Any) -> dict[str, Any] | None:
        """DDP's averaged gradients (rank 0); None under FSDP, which shards them."""
        if self.knobs.parallel == "fsdp" or not self.reports:
            return None
        return super().gradients(model.module)

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.local_rank])
        else:
            dist.barrier()

    def global_batch(self, batch_size: int) -> int:
        """Samples of one step over all ranks: each rank trains on its own batch."""
        return self.world_size * batch_size

    def combine(self, metrics: Metrics) -> Metrics:
        """Every rank's times and memory to every rank; the slowest rank's wall time makes the
        global throughput (world_size x batch_size x steps / wall)."""
        mine = [
            metrics.measured_wall_s or 0.0,
            metrics.first_step_s or 0.0,
            metrics.warmup_s or 0.0,
            float(metrics.peak_memory_bytes or 0),
        ]
        table = torch.zeros(self.world_size, len(mine), dtype=torch.float64)
        table[self.rank] = torch.tensor(mine, dtype=torch.float64)
        table = table.to(self._collective_device)
        dist.all_reduce(table)  # the sum of one filled row per rank: every rank's row
        walls, first_steps, warmups, peaks = (table[:, column].tolist() for column in range(4))
        slowest = max(walls)
        samples = self.global_batch(metrics.batch_size_per_process or 0)
        return dataclasses.replace(
            metrics,
            throughput_samples_per_s=samples * len(metrics.step_times_s) / slowest,
            measured_wall_s=slowest,
            first_step_s=max(first_steps),
            warmup_s=max(warmups),
            peak_memory_bytes=int(max(peaks)),
            world_size=self.world_size,
            distributed_backend=self.backend,
            rank_measured_wall_s=walls,
        )

    def combine_telemetry(self, conditions: Conditions) -> Conditions:
        """Every rank sampled its own GPU (or CPU): the record keeps each rank's energy, median
        SM clock and samples (rank_*), every throttle reason any rank saw, the most other
        processes any rank's GPU had; the cell's energy and mean power are the ranks' sums
        (where a rank measured no energy, none, saying on how many ranks it was)."""
        mine = torch.tensor([_number(conditions, f) for f in RANK_TELEMETRY], dtype=torch.float64)
        mine = mine.nan_to_num(nan=-1.0).to(self._collective_device)  # -1: not measured
        gathered = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        rows = [[None if value < 0 else value for value in row.tolist()] for row in gathered]
        energy, power, clock, samples, reasons, others = zip(*rows, strict=True)
        conditions.rank_energy_j, conditions.rank_gpu_sm_mhz_median = list(energy), list(clock)
        conditions.rank_gpu_samples = [int(s or 0) for s in samples]
        bits = functools.reduce(operator.or_, (int(r or 0) for r in reasons), 0)
        conditions.gpu_throttle_reasons = ", ".join(throttle_names(bits))
        if any(o is not None for o in others):
            conditions.gpu_other_processes = int(max(o or 0 for o in others))
        if conditions.gpu_power_w_mean is not None and None not in power:
            conditions.gpu_power_w_mean = sum(power)
        measured = [e for e in energy if e is not None]
        if len(measured) == self.world_size:
            conditions.energy_j = sum(measured)
        else:
            conditions.energy_j, conditions.energy_source = None, ""
            why = f"measured on {len(measured)} of {self.world_size} ranks"
            if conditions.energy_not_measured:
                why += f"; this rank: {conditions.energy_not_measured}"
            conditions.energy_not_measured = why
        return conditions

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


# What each rank's window measured that the record keeps per rank (a float each; the throttle
# reasons as NVML's bits).
RANK_TELEMETRY = ("energy_j", "gpu_power_w_mean", "gpu_sm_mhz_median", "gpu_samples",
                  "gpu_throttle_bits", "gpu_other_processes")  # fmt: skip


def _number(conditions: Conditions, name: str) -> float:
    if name == "gpu_throttle_bits":
        return float(throttle_bits(conditions.gpu_throttle_reasons))
    value = getattr(conditions, name)
    return math.nan if value is None else float(value)
