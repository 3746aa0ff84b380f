"""Where a step's time goes: the classifier, the partition's sum, the profiled steps of a cell,
the kept trace, the tables' columns and the sentence beside a speedup."""

from __future__ import annotations

import gzip
import json
import math
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import (
    TABLE_NAMES,
    aggregate_cli,
    benchmark_python,
    fixture_paths,
    render_tables,
    settings_of,
)

from ptspeed.analysis import breakdown as tables
from ptspeed.analysis.columns import read_table
from ptspeed.cell.harness import run_cell
from ptspeed.cell.measurement import profiling
from ptspeed.cell.measurement.breakdown import STEP_ANNOTATION, SUM_TOLERANCE, breakdown
from ptspeed.cell.measurement.work_kinds import KINDS, classify_kernel, classify_op
from ptspeed.cell.record import CellSpec
from ptspeed.launch.watchdog import run_cell_in_worker
from ptspeed.plan.layout import Cell
from ptspeed.plan.matrix import profiled_steps
from ptspeed.plan.schema import default_config

TRACES = Path(__file__).parent / "fixtures" / "traces"

# Op names as torch 1.13.1, 2.0.1 and 2.14.1 record them in an mlp, resnet50 and BERT step.
OP_KINDS = {
    "aten::addmm": "matmul",
    "aten::mm": "matmul",
    "aten::linear": "matmul",
    "autograd::engine::evaluate_function: AddmmBackward0": "matmul",
    "MmBackward0": "matmul",
    "aten::bmm": "matmul",
    "aten::mkldnn_convolution": "matmul",
    "aten::convolution_backward": "matmul",
    "ConvolutionBackward0": "matmul",
    "aten::scaled_dot_product_attention": "attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::relu": "elementwise",
    "aten::clamp_min": "elementwise",
    "aten::threshold_backward": "elementwise",
    "ReluBackward0": "elementwise",
    "aten::gelu": "elementwise",
    "NativeDropoutBackward0": "elementwise",
    "aten::native_layer_norm": "norm",
    "NativeLayerNormBackward0": "norm",
    "aten::native_batch_norm": "norm",
    "aten::_log_softmax": "reduction",
    "LogSoftmaxBackward0": "reduction",
    "NllLossBackward0": "reduction",
    "aten::sum": "reduction",
    "aten::max_pool2d_with_indices": "reduction",
    "aten::copy_": "copy",
    "aten::_to_copy": "copy",
    "aten::contiguous": "copy",
    "aten::embedding": "copy",
    "aten::zero_": "copy",
    "Optimizer.step#SGD.step": "optimizer",
    "Optimizer.zero_grad#SGD.zero_grad": "optimizer",
    "Optimizer.step#ptspeed": "optimizer",
    "aten::_foreach_add_": "optimizer",
    "CompiledFunction": "compiled",
    "autograd::engine::evaluate_function: CompiledFunctionBackward": "compiled",
    "Torch-Compiled Region: 0/0": "compiled",
    "## Call CompiledFxGraph fgxvsbkziwnyv3 ##": "compiled",
    "c10d::allreduce_": "collective",
    "record_param_comms": "collective",
    "aten::t": "host",
    "TBackward0": "host",
    "aten::permute": "host",
    "aten::as_strided": "host",
    "aten::empty_strided": "host",
    "aten::detach": "host",
    "torch::autograd::AccumulateGrad": "host",
    "TorchDynamo Cache Lookup": "host",
}
KERNEL_KINDS = {
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8": "matmul",
    "ampere_sgemm_128x64_nn": "matmul",
    "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float>": "norm",
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80": "attention",
    "triton_poi_fused_relu_threshold_backward_0": "compiled",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>": "copy",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": (
        "elementwise"
    ),
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>": "reduction",
    "ncclKernel_AllReduce_RING_LL_Sum_float": "collective",
    "void at::native::multi_tensor_apply_kernel<TensorListMetadata<3>>": "optimizer",
    "triton_tem_fused_mm_0": "matmul",
    "triton_tem_fused_flex_attention_0": "attention",
}
# GEMM kernels as the profiler names them on each GPU generation the platforms list.
GEMM_KERNELS = (
    "volta_sgemm_128x64_nn",  # sm_70, cuBLAS 10/11
    "volta_h884gemm_64x64_ldg8_nn",
    "turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn",  # sm_75
    "ampere_sgemm_128x64_nn",  # sm_80/86
    "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",
    "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
    "segment_k_off_kernel__5x_cublas",  # sm_90, cuBLAS 12.0-12.3
    "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT",  # sm_90, cuBLAS 12.4+
    "nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNN",
    "nvjet_sm100_tst_256x128_64x4_2x1_2cta_v_bz_TNT",  # sm_100
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_tn_align8>",
    "cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8_warpspecialized",
    "triton_tem_fused_addmm_relu_0",  # Inductor's mm template
)


@pytest.mark.parametrize(("name", "kind"), OP_KINDS.items())
def test_op_names_of_every_torch_version_get_their_kind(name: str, kind: str) -> None:
    assert classify_op(name) == kind


@pytest.mark.parametrize(("name", "kind"), KERNEL_KINDS.items())
def test_kernel_names_get_their_kind(name: str, kind: str) -> None:
    assert classify_kernel(name) == kind


def test_copies_go_by_their_category() -> None:
    assert classify_kernel("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy") == "copy"
    assert classify_kernel("Memset (Device)", "Memset") == "copy"


def _trace(name: str) -> dict:
    with gzip.open(TRACES / f"{name}.json.gz", "rt", encoding="utf-8") as handle:
        return json.load(handle)


@pytest.mark.parametrize(
    "name", sorted(p.name.removesuffix(".json.gz") for p in TRACES.glob("*.json.gz"))
)
def test_real_traces_sum_to_the_step_time(name: str) -> None:
    """Traces of three mlp steps in torch 1.13.1, 2.0.1 and 2.14.1 (eager and compiled)."""
    parts = breakdown(_trace(name))
    assert parts.timeline == "cpu" and parts.steps == 3
    assert abs(parts.sum_error) <= SUM_TOLERANCE and parts.sums
    assert set(parts.time_by_kind_s) <= set(KINDS)
    assert parts.time_by_kind_s["matmul"] > 0 and parts.time_by_kind_s["optimizer"] > 0
    assert parts.counts_by_kind["matmul"] == 5  # 2 forward, 3 backward
    # Names nothing else claims stay small: at most 5 % of the step.
    assert parts.time_by_kind_s.get("other", 0.0) <= 0.05 * parts.step_time_s


@pytest.mark.parametrize("version", ["2.0", "2.14"])
def test_a_compiled_mlp_runs_compiler_generated_code_and_fewer_elementwise_ops(
    version: str,
) -> None:
    eager = breakdown(_trace(f"torch-{version}-mlp-eager"))
    compiled = breakdown(_trace(f"torch-{version}-mlp-compile"))
    assert compiled.time_by_kind_s.get("compiled", 0.0) > 0
    assert "compiled" not in eager.time_by_kind_s
    assert compiled.counts_by_kind.get("elementwise", 0) < eager.counts_by_kind["elementwise"]


def _event(name: str, start: float, duration: float, category: str = "cpu_op", **args) -> dict:
    return {"ph": "X", "cat": category, "name": name, "pid": 1, "tid": 1, "ts": start,
            "dur": duration, "args": args}  # fmt: skip


def test_self_times_partition_the_step_and_nameless_ops_take_their_callers_kind() -> None:
    events = [
        _event(f"{STEP_ANNOTATION}0", 0, 100, "user_annotation"),
        _event("aten::linear", 10, 40),
        _event("aten::t", 11, 4),
        _event("aten::addmm", 20, 25),
        _event("aten::arange", 30, 5),  # says nothing: counts as the addmm it runs in
        _event("Optimizer.step#SGD.step", 60, 30, "user_annotation"),
        _event("aten::add_", 61, 20),  # elementwise by name, optimizer by where it runs
    ]
    parts = breakdown({"traceEvents": events})
    assert parts.step_time_s == pytest.approx(100e-6)
    times = {kind: round(value * 1e6, 6) for kind, value in parts.time_by_kind_s.items()}
    assert times == {"matmul": 36.0, "host": 100.0 - 40.0 - 30.0 + 4.0, "optimizer": 30.0}
    assert parts.sum_error == pytest.approx(0.0)
    assert parts.counts_by_kind == {"matmul": 1.0, "optimizer": 1.0}


def test_gpu_time_by_kind_counts_overlap_once_and_the_rest_is_idle() -> None:
    events = [
        _event(f"{STEP_ANNOTATION}0", 0, 100, "user_annotation"),
        {**_event(f"{STEP_ANNOTATION}0", 10, 50, "gpu_user_annotation"), "tid": 7},
        _event("aten::mm", 5, 10),
        _event("cudaLaunchKernel", 6, 2, "cuda_runtime", correlation=1),
        _event("Optimizer.step#SGD.step", 20, 10, "user_annotation"),
        _event("cudaLaunchKernel", 21, 2, "cuda_runtime", correlation=2),
        {**_event("ampere_sgemm_128x64_nn", 10, 40, "kernel", correlation=1), "tid": 7},
        {**_event("elementwise_kernel<add>", 40, 20, "kernel", correlation=2), "tid": 7},
    ]
    parts = breakdown({"traceEvents": events})
    assert parts.timeline == "gpu"
    times = {kind: round(value * 1e6, 6) for kind, value in parts.time_by_kind_s.items()}
    assert times == {"matmul": 40.0, "optimizer": 10.0, "idle": 50.0}
    assert parts.sums and parts.kernels_per_step == 2


def _launched(kernel: str, *around: str, launch: str = "cudaLaunchKernel") -> dict:
    """A one-step GPU trace: ``kernel`` (40 us of a 100 us step) launched inside the ops
    ``around`` (outermost first)."""
    events = [
        _event(f"{STEP_ANNOTATION}0", 0, 100, "user_annotation"),
        {**_event(f"{STEP_ANNOTATION}0", 0, 100, "gpu_user_annotation"), "tid": 7},
        *(_event(op, 1 + depth, 20 - 2 * depth) for depth, op in enumerate(around)),
        _event(launch, 8, 2, "cuda_runtime", correlation=1),
        {**_event(kernel, 10, 40, "kernel", correlation=1), "tid": 7},
    ]
    return {"traceEvents": events}


GEMM_CONTEXTS = {
    "eager": ("aten::linear", "aten::addmm"),
    "compiled": ("CompiledFunction", "## Call CompiledFxGraph f1 ##", "aten::mm"),
    "graph replay": ("CompiledFunction",),  # a CUDA graph: one launch, no op per kernel
}


@pytest.mark.parametrize("context", GEMM_CONTEXTS)
@pytest.mark.parametrize("kernel", GEMM_KERNELS)
def test_gemms_of_every_generation_are_matmul_in_every_context(kernel: str, context: str) -> None:
    launch = "cudaGraphLaunch" if context == "graph replay" else "cudaLaunchKernel"
    parts = breakdown(_launched(kernel, *GEMM_CONTEXTS[context], launch=launch))
    times = {kind: round(value * 1e6, 6) for kind, value in parts.time_by_kind_s.items()}
    assert times == {"matmul": 40.0, "idle": 60.0}


H200_VARIANTS = ("eager", "compile", "cudagraphs", "compile-reduce-overhead")


def test_on_an_h200_the_same_gemms_are_matmul_in_every_variant() -> None:
    """Traces recorded on an H200 (torch 2.11, CUDA 13, the GPU check's mlp): cuBLAS's and
    CUTLASS's GEMMs count as matmul whether launched eagerly, from a compiled graph or replayed
    from a CUDA graph, so matmul time agrees across the variants and nothing is left unnamed."""
    parts = {name: breakdown(_trace(f"h200/torch-2.11-mlp-{name}")) for name in H200_VARIANTS}
    matmul_us = {name: p.time_by_kind_s["matmul"] * 1e6 for name, p in parts.items()}
    assert max(matmul_us.values()) / min(matmul_us.values()) < 1.1, matmul_us
    for name, part in parts.items():
        assert part.timeline == "gpu" and part.sums, name
        assert "other" not in part.time_by_kind_s, (name, part.time_by_kind_s)
    assert "compiled" in parts["compile"].time_by_kind_s


def test_a_kernel_named_for_nothing_takes_the_kind_of_the_op_that_launched_it() -> None:
    """Inside a compiled region an extern ``aten::mm`` launches cuBLAS: a GEMM whatever its
    name; a Triton kernel there is compiler-generated."""
    inside = ("CompiledFunction", "## Call CompiledFxGraph f1 ##")
    mm = breakdown(_launched("void tile_kernel_plain<float>", *inside, "aten::mm"))
    assert set(mm.time_by_kind_s) == {"matmul", "idle"}
    unnamed = breakdown(_launched("void some_kernel<float>", *inside))
    assert set(unnamed.time_by_kind_s) == {"compiled", "idle"}
    generated = breakdown(_launched("triton_poi_fused_add_0", *inside, "triton_poi_fused_add_0"))
    assert set(generated.time_by_kind_s) == {"compiled", "idle"}


def test_a_trace_without_steps_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no ptspeed\.profiled_step"):
        breakdown({"traceEvents": [_event("aten::mm", 0, 1)]})


def test_profiled_steps_write_a_trace_that_opens(tmp_path: Path) -> None:
    weight = torch.randn(64, 64, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def step() -> None:
        optimizer.zero_grad()
        torch.relu(weight @ weight).sum().backward()
        optimizer.step()

    target = tmp_path / "traces" / "cell.json.gz"
    spec = CellSpec("mlp", "eager", "eager", "train", 2, profile_steps=2, profile_trace=str(target))
    profile = profiling.profile_steps(spec, step, optimizer, torch.device("cpu"))
    assert profile.profiled and profile.reason == "" and profile.steps == 2
    assert profile.sums and abs(profile.sum_error) <= SUM_TOLERANCE
    assert profile.time_by_kind_s["optimizer"] > 0 and profile.time_by_kind_s["matmul"] > 0
    assert "step" not in vars(optimizer)  # the annotation is gone again
    trace = profiling.read_trace(profile.trace)
    assert profile.trace == str(target)
    names = {event.get("name") for event in trace["traceEvents"]}
    assert f"{STEP_ANNOTATION}1" in names and "Optimizer.step#ptspeed" in names
    assert not list(Path(profile.trace).parent.glob(".*"))  # no temporary left


def test_no_profiled_steps_unless_asked() -> None:
    spec = CellSpec("mlp", "eager", "eager", "train", 2)
    profile = profiling.profile_steps(spec, lambda: None, None, torch.device("cpu"))
    assert not profile.profiled and "not asked" in profile.reason


def test_a_profiler_that_fails_costs_the_breakdown_only() -> None:
    spec = CellSpec("mlp", "eager", "eager", "train", 2, profile_steps=1)

    def broken() -> None:
        raise RuntimeError("boom")

    profile = profiling.profile_steps(spec, broken, None, torch.device("cpu"))
    assert not profile.profiled and "RuntimeError: boom" in profile.reason


def _cell(knobs: str, tmp_path: Path) -> CellSpec:
    return CellSpec(
        "mlp", knobs, knobs, "train", 16, warmup_steps=2, measured_steps=20, numerics_steps=0,
        profile_steps=3, profile_trace=str(tmp_path / f"{knobs}.json.gz"),
    )  # fmt: skip


@pytest.mark.slow
def test_a_compiled_cell_shows_compiler_generated_kernels_and_fewer_elementwise_ops(
    tmp_path: Path,
) -> None:
    eager, compiled = (run_cell(_cell(knobs, tmp_path)) for knobs in ("eager", "compile"))
    for record in (eager, compiled):
        assert record.status == "ok", record.reason
        assert record.profile.profiled and record.profile.sums, record.profile
        assert "traceEvents" in profiling.read_trace(record.profile.trace)
    assert compiled.profile.time_by_kind_s["compiled"] > 0
    assert "compiled" not in eager.profile.time_by_kind_s
    elementwise = [r.profile.ops_by_kind.get("elementwise", 0) for r in (eager, compiled)]
    assert elementwise[1] < elementwise[0]
    assert compiled.metrics.recompilations == 0  # the profiled steps compiled nothing again


@pytest.mark.crossversion
@pytest.mark.parametrize("env", ["torch-1.13", "torch-2.0"])
def test_profiled_steps_in_the_older_environments(env: str, tmp_path: Path) -> None:
    spec = _cell("eager", tmp_path)
    record = run_cell_in_worker(spec, tmp_path / "record.json", python=benchmark_python(env))
    assert record.status == "ok", record.reason
    assert record.provenance.torch.startswith(env.removeprefix("torch-"))
    profile = record.profile
    assert profile.profiled and profile.sums and abs(profile.sum_error) <= SUM_TOLERANCE
    assert profile.ops_by_kind["matmul"] == 5
    assert "traceEvents" in profiling.read_trace(profile.trace)


# --- the tables and the sentence ---


def _side(step_ms: float, kernels: float, **times_ms: float) -> dict:
    times = dict.fromkeys(KINDS, 0.0) | {k: v / 1e3 for k, v in times_ms.items()}
    return {"timeline": "cpu", "step_s": step_ms / 1e3, "times": times, "kernels": kernels,
            "copies": 0.0, "trace": ""}  # fmt: skip


def test_the_sentence_names_the_biggest_changes_with_their_sizes() -> None:
    base = _side(10.0, 412, elementwise=4.0, matmul=5.0, host=1.0)
    cand = _side(8.0, 96, elementwise=1.52, matmul=5.05, compiled=1.0, host=0.43)
    sentence = tables.explain(base, cand)
    assert sentence == (
        "elementwise −62 % (4.0 → 1.5 ms), compiler-generated new (1.0 ms), "
        "Python/framework −57 % (1.0 → 0.43 ms); ops per step 412 → 96"
    )


def test_the_sentence_is_empty_without_both_sides_and_says_when_timelines_differ() -> None:
    assert tables.explain({}, _side(1.0, 1)) == ""
    gpu = {**_side(1.0, 1), "timeline": "gpu"}
    assert "not comparable" in tables.explain(_side(1.0, 1), gpu)


def test_the_breakdown_comes_from_a_quiet_trial_and_says_when_there_was_none() -> None:
    quiet_profile = {"profiled": True, "timeline": "cpu", "step_time_s": 0.01,
                     "time_by_kind_s": {"matmul": 0.01}}  # fmt: skip
    loaded = tables.run_columns(
        {**quiet_profile, "step_time_s": 0.05, "time_by_kind_s": {"matmul": 0.05}}
    )
    quiet = tables.run_columns(quiet_profile)
    trials = {column: [loaded[column], quiet[column]] for column in tables.RUN_COLUMNS}
    # Trial 0 profiled on a loaded machine; its rerun (trial 5) profiled quietly.
    chosen = tables.summarise({**trials, "perturbed": [True, False]}, [True, True])
    assert chosen["profile_step_s"] == 0.01 and not chosen["profile_notes"]
    only_loaded = tables.summarise({**trials, "perturbed": [True, pd.NA]}, [True, False])
    assert only_loaded["profile_step_s"] == 0.05
    assert only_loaded["profile_notes"] == tables.PERTURBED_NOTE
    side = tables.side(tables.side_columns("baseline", only_loaded), "baseline_")
    assert side["perturbed"]
    sentence = tables.explain(side, {**_side(10.0, 1, matmul=10.0), "perturbed": False})
    assert sentence.endswith("; baseline profiled on a perturbed trial (times inflated)")


def test_the_first_trial_and_its_reruns_profile_and_no_other() -> None:
    settings = settings_of(
        {**default_config(), "steps": {"profiled": 3}, "trials": 5, "results": "results"}
    )
    profiled = {
        trial: profiled_steps(settings, Cell("host", "mlp", "eager", "train", "b16", trial=trial))
        for trial in (0, 1, 4, 5, 6, 10)
    }
    assert [trial for trial, fields in profiled.items() if fields] == [0, 5, 10]
    assert profiled[0] == profiled[5]  # one trace per cell: a rerun's replaces the first's
    assert profiled[0]["profile_trace"].startswith("results/traces/host/mlp/eager/train/")


def test_a_record_profile_becomes_runs_summary_and_speedup_columns() -> None:
    profile = {
        "profiled": True, "timeline": "cpu", "step_time_s": 0.01, "sum_error": 0.0,
        "sums": True, "time_by_kind_s": {"matmul": 0.006, "host": 0.004},
        "kernels_per_step": 12.0, "copies_per_step": 2.0, "ops_by_kind": {"elementwise": 3.0},
        "trace": "results/traces/x.json.gz", "notes": "",
    }  # fmt: skip
    row = tables.run_columns(profile)
    assert row["time_matmul_s"] == 0.006 and row["time_elementwise_s"] == 0.0
    assert row["elementwise_ops_per_step"] == 3.0 and row["trace"].endswith("x.json.gz")
    assert set(row) == set(tables.RUN_COLUMNS)
    unprofiled = tables.run_columns({"profiled": False, "reason": "not asked"})
    assert unprofiled["time_matmul_s"] is None
    trials = {column: [row[column], unprofiled[column]] for column in tables.RUN_COLUMNS}
    summary = tables.summarise(trials, [True, True])
    assert summary["profiled_trials"] == 1 and summary["time_matmul_s"] == 0.006
    assert list(summary) == tables.SUMMARY_COLUMNS or set(summary) == set(tables.SUMMARY_COLUMNS)
    side = tables.side_columns("candidate", summary)
    assert side["candidate_time_host_s"] == 0.004
    assert tables.side(side, "candidate_")["kernels"] == 12.0
    empty = tables.summarise({c: [unprofiled[c]] for c in tables.RUN_COLUMNS}, [True])
    assert empty["profiled_trials"] == 0 and math.isnan(empty["time_matmul_s"])


# --- the report ---


def _profile_of(trace: str) -> dict:
    parts = breakdown(_trace(trace))
    return {
        "profiled": True, "steps": 3, "activities": "cpu", "timeline": "cpu",
        "step_time_s": parts.step_time_s, "time_by_kind_s": parts.time_by_kind_s,
        "sum_error": parts.sum_error, "sums": parts.sums, "tolerance": SUM_TOLERANCE,
        "kernels_per_step": parts.kernels_per_step, "copies_per_step": parts.copies_per_step,
        "ops_by_kind": parts.counts_by_kind, "trace": f"results/traces/{trace}.json.gz",
    }  # fmt: skip


@pytest.mark.slow  # the aggregation script and a whole report: seconds
def test_the_report_shows_the_breakdown_and_sentence_beside_each_speedup(tmp_path: Path) -> None:
    paths = fixture_paths(tmp_path)
    profiled = 0
    for path in paths:
        if not path.exists() or not path.name.endswith("_0.json"):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if data.get("status") != "ok":
            continue
        knobs = data["cell"]["knobs"]
        version = "2.0" if "2.0" in data["cell"]["env"] else "1.13"
        name = f"torch-{version}-mlp-{'compile' if 'compile' in knobs else 'eager'}"
        if name == "torch-1.13-mlp-compile":
            continue
        path.write_text(json.dumps({**data, "profile": _profile_of(name)}), encoding="utf-8")
        profiled += 1
    assert profiled
    out_dir = aggregate_cli(tmp_path, paths)
    frames = {name: read_table(out_dir / f"{name}.csv") for name in TABLE_NAMES}
    assert (frames["summary"]["profiled_trials"] > 0).any()
    sentences = frames["speedups"][tables.SENTENCE].dropna()
    assert any("ops per step" in s for s in sentences)
    report = tmp_path / "report"
    render_tables(frames, report)
    html = (report / "index.html").read_text(encoding="utf-8")
    markdown = (report / "report.md").read_text(encoding="utf-8")
    seed_html = html[html.index('id="seed-table"') : html.index('id="claims"')]
    seed_markdown = markdown[: markdown.index("## Speedups against the published claims")]
    for seed in (seed_html, seed_markdown):  # beside each speedup: in the seed table
        assert "where the time went (per profiled step)" in seed and "ops per step" in seed
    assert '<a href="../traces/torch-2.0-mlp-eager.json.gz">baseline trace</a>' in seed_html
    assert "[candidate trace](../traces/torch-2.0-mlp-compile.json.gz)" in seed_markdown
    assert "Milliseconds per profiled step by kind of work" in seed_html  # the stacked bars
    versions = html[html.index('id="versions"') : html.index('id="summary"')]
    assert "torch version to version" in versions and "../traces/torch-1.13-mlp-eager" in versions


@pytest.mark.slow  # a whole cell and a second's sleep
def test_the_profiled_steps_run_after_the_window_and_never_change_its_throughput(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However slow the profiled steps are (here a second more), the measured window and
    its throughput are done before they start: the window holds the measured steps alone."""
    real = profiling.profile_steps
    seen = {}

    def slow_profile(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(1.0)
        seen["after"] = True
        return real(*args, **kwargs)

    monkeypatch.setattr(profiling, "profile_steps", slow_profile)
    spec = CellSpec(
        "mlp", "eager", "eager", "train", 2, warmup_steps=1, measured_steps=5, numerics_steps=0,
        profile_steps=2, profile_trace=str(tmp_path / "t.json.gz"),
    )  # fmt: skip
    record = run_cell(spec)
    assert record.status == "ok" and seen and record.profile.profiled
    metrics = record.metrics
    assert metrics.measured_wall_s < sum(metrics.step_times_s) + 0.5
    assert metrics.throughput_samples_per_s == pytest.approx(2 * 5 / metrics.measured_wall_s)
