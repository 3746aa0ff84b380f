"""The SLURM nodes of a comparison's trials, as the report states them."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ptspeed.analysis.nodes import comparison_nodes

COMPARISON = {
    "baseline": {"env": "old", "variant": "eager"},
    "candidate": {"env": "new", "variant": "eager"},
}


def runs(nodes: dict[tuple[str, int], str], status: str = "ok") -> pd.DataFrame:
    rows: list[dict[str, Any]] = [
        {"platform": "", "model": "mlp", "mode": "train", "trial": trial, "env": env,
         "variant": "eager", "status": status, "slurm_node": node}
        for (env, trial), node in nodes.items()
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_trials_on_one_node_each_say_so() -> None:
    use = comparison_nodes(
        runs({("old", 0): "n1", ("new", 0): "n1", ("old", 1): "n2", ("new", 1): "n2"}),
        COMPARISON,
    )
    assert use is not None
    assert use.describe() == "Ran on nodes n1, n2; each trial's baseline and candidate on one node."


def test_a_trial_split_over_nodes_is_named() -> None:
    use = comparison_nodes(
        runs({("old", 0): "n1", ("new", 0): "n1", ("old", 1): "n1", ("new", 1): "n2"}),
        COMPARISON,
    )
    assert use is not None and use.split_trials == (1,)
    assert "trial 1 ran its baseline and candidate on different nodes" in use.describe()


def test_runs_outside_slurm_name_no_nodes() -> None:
    assert comparison_nodes(runs({("old", 0): "", ("new", 0): ""}), COMPARISON) is None
    assert comparison_nodes(runs({("old", 0): "n1"}).drop(columns="slurm_node"), COMPARISON) is None
    assert comparison_nodes(runs({("old", 0): "n1"}, status="failed"), COMPARISON) is None
