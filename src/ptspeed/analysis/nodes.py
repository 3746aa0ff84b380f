"""The SLURM nodes a comparison's trials ran on, from the runs table's ``slurm_node`` column.

On a cluster trial k of a comparison's baseline and candidate run back to back in one job on one
node (ptspeed.plan.matrix.trial_groups). Node-to-node differences (clocks, thermals, a noisy
neighbour) would otherwise enter the speedup: :func:`comparison_nodes` says which nodes each
side's ok trials ran on and which trials ran their two sides on different nodes (a rerun of one
side, or a run planned without groups). Pure; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ptspeed.analysis.columns import SIDES

NODE = "slurm_node"
# A trial's place: the cell but for the side (its environment and variant).
PLACE = ["platform", "model", "mode", "trial"]
SIDES_SUFFIXES = tuple(f"_{side}" for side in SIDES)


@dataclass(frozen=True)
class NodeUse:
    """The nodes of a comparison's ok trials."""

    nodes: tuple[str, ...]
    split_trials: tuple[int, ...]  # trials whose baseline and candidate ran on different nodes

    def describe(self) -> str:
        """One sentence for the report."""
        where = f"Ran on node{'s' if len(self.nodes) > 1 else ''} {', '.join(self.nodes)}"
        if not self.split_trials:
            return f"{where}; each trial's baseline and candidate on one node."
        trials = ", ".join(str(trial) for trial in self.split_trials)
        return (
            f"{where}; trial {trials} ran its baseline and candidate on different nodes, so "
            "node-to-node differences are in this speedup."
        )


def comparison_nodes(runs: pd.DataFrame, comparison: Mapping[str, Any]) -> NodeUse | None:
    """The nodes the ok trials of ``comparison`` (its baseline and candidate env and variant)
    ran on; None where no trial recorded a node (a run outside SLURM)."""
    if NODE not in runs.columns:
        return None
    ok = runs[(runs["status"] == "ok") & runs[NODE].notna() & (runs[NODE] != "")]
    sides = [_side_nodes(ok, comparison[side]) for side in SIDES]
    if all(side.empty for side in sides):
        return None
    nodes = sorted(set(sides[0][NODE]) | set(sides[1][NODE]))
    paired = sides[0].merge(sides[1], on=PLACE, suffixes=SIDES_SUFFIXES)
    split = paired[paired[f"{NODE}_baseline"] != paired[f"{NODE}_candidate"]]
    return NodeUse(tuple(nodes), tuple(sorted({int(trial) for trial in split["trial"]})))


def _side_nodes(ok: pd.DataFrame, side: Mapping[str, str]) -> pd.DataFrame:
    rows = ok[(ok["env"] == side["env"]) & (ok["variant"] == side["variant"])]
    return rows.reindex(columns=[*PLACE, NODE]).fillna({"platform": ""})
