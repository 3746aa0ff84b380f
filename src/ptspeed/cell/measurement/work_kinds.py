"""The kinds of work a profiled step's time goes to, and the rules that name an op's or a GPU
kernel's kind by its name (the standard library only).

:func:`classify_op` reads a CPU-side op or annotation of a ``torch.profiler`` trace,
:func:`classify_kernel` a kernel, copy or memset on the GPU; each returns None where the name
says nothing. :mod:`ptspeed.cell.measurement.breakdown` partitions a step's time with them.
"""

from __future__ import annotations

import re

# The optimizer's step as torch's own profiling hook names it ("Optimizer.step#SGD.step",
# "Optimizer.zero_grad#SGD.zero_grad"), lower case.
OPTIMIZER_PREFIX = "optimizer."

KINDS = (
    "matmul",
    "attention",
    "elementwise",
    "norm",
    "reduction",
    "copy",
    "optimizer",
    "compiled",
    "collective",
    "idle",
    "host",
    "other",
)
KIND_HELP = {
    "matmul": "matrix multiplies and convolutions (mm, addmm, bmm, linear, conv*, GEMM kernels)",
    "attention": "attention kernels (scaled_dot_product_attention, flash / memory-efficient)",
    "elementwise": "elementwise ops and activations (add, mul, relu, gelu, dropout, …)",
    "norm": "normalisation (layer_norm, batch_norm, group_norm)",
    "reduction": "reductions, softmax and losses (sum, mean, max, softmax, nll_loss, pooling)",
    "copy": "memory copies, fills and layout changes that move data (copy_, to, contiguous, "
    "cat, index/gather, embedding, memcpy, memset; views such as permute are host)",
    "optimizer": "the optimizer's step and zero_grad (and foreach / fused update kernels)",
    "compiled": "compiler-generated code (Inductor's fused C++ or Triton kernels and its "
    "wrapper, the self time of a compiled region)",
    "collective": "collectives (c10d, NCCL, Gloo)",
    "idle": "CUDA: the GPU idle between kernels inside the step (host overhead, launch-bound)",
    "host": "CPU: Python and the framework outside any op and in bookkeeping ops (views, "
    "allocation, autograd's bookkeeping, Dynamo's guards)",
    "other": "ops and kernels none of the above names",
}

_BACKWARD_SUFFIX = re.compile(r"backward\d*$")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_PREFIXES = ("aten::", "autograd::engine::evaluate_function: ", "torch::autograd::", "c10d::")


def _token(*names: str) -> str:
    """A regular expression matching any of ``names`` as a whole word of an op name
    (words apart by ``_``, ``.``, ``:`` or the name's ends; a trailing ``_`` or digits
    allowed: ``add_``, ``conv2d``)."""
    return r"(?:^|[_.:\s])(?:" + "|".join(names) + r")(?:_|\d+d?)*(?=$|[_.:\s])"


# First match wins: the order settles names that two rules would take.
_OP_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("optimizer", r"^optimizer\.|_foreach_|_fused_(sgd|adam)|" + _token("addcdiv", "addcmul")),
        ("compiled", r"compiledfunction|torch-compiled region|compiledfxgraph|cpp_fused|triton_"),
        (
            "collective",
            r"c10d|nccl|gloo|all_?reduce|all_?gather|reduce_scatter|broadcast_|"
            r"record_param_comms|alltoall",
        ),
        ("attention", r"scaled_dot_product|attention|flash|fmha|_sdpa|_efficient_att"),
        ("norm", r"norm(?!al)"),
        ("elementwise", r"upsample|interpolate|clamp|maximum|minimum|threshold"),
        (
            "matmul",
            _token(
                "mm",
                "addmm",
                "bmm",
                "baddbmm",
                "matmul",
                "linear",
                "einsum",
                "mv",
                "addmv",
                "dot",
                "gemm",
                "conv",
                "convolution",
                "mkldnn_convolution",
                "cudnn_convolution",
                "thnn_conv",
                "slow_conv",
                "conv_transpose",
                "mkldnn_linear",
                "addbmm",
            )
            + r"|conv|gemm",
        ),
        (
            "reduction",
            r"softmax|loss|cross_entropy|pool|"
            + _token(
                "sum",
                "mean",
                "max",
                "min",
                "amax",
                "amin",
                "argmax",
                "argmin",
                "prod",
                "var",
                "std",
                "cumsum",
                "logsumexp",
                "topk",
                "sort",
                "norm",
                "all",
                "any",
                "median",
            ),
        ),
        (
            "copy",
            _token(
                "copy",
                "to",
                "contiguous",
                "clone",
                "cat",
                "stack",
                "index",
                "index_select",
                "gather",
                "scatter",
                "embedding",
                "pad",
                "constant_pad",
                "repeat",
                "flip",
                "roll",
                "narrow_copy",
                "fill",
                "zero",
                "zeros",
                "ones",
                "ones_like",
                "zeros_like",
                "full",
                "full_like",
                "masked_scatter",
                "tril",
                "triu",
                "unfold",
                "col2im",
                "im2col",
                "embedding_dense",
                "put",
                "take",
                "new_zeros",
                "new_ones",
                "new_full",
                "memcpy",
                "memset",
            ),
        ),
        (
            "host",
            _token(
                "empty",
                "empty_like",
                "empty_strided",
                "resize",
                "as_strided",
                "view",
                "unsafe_view",
                "reshape",
                "expand",
                "t",
                "transpose",
                "permute",
                "detach",
                "alias",
                "unsqueeze",
                "squeeze",
                "slice",
                "select",
                "split",
                "chunk",
                "unbind",
                "narrow",
                "resolve_conj",
                "resolve_neg",
                "lift_fresh",
                "result_type",
                "item",
                "local_scalar_dense",
                "is_nonzero",
                "accumulategrad",
                "size",
                "stride",
                "numel",
                "flatten",
                "view_as",
                "expand_as",
                "unflatten",
                "lift",
                "new_empty",
                "new_empty_strided",
                "is_same_size",
                "has_compatible_shallow_copy_type",
                "set_",
                "record_stream",
            )
            + r"|cache lookup|pregraph bytecode|aotdispatcher|profiler|cudagraph|autograd::|"
            r"^detach$|^_?to$",
        ),
        (
            "elementwise",
            _token(
                "add",
                "sub",
                "rsub",
                "mul",
                "div",
                "relu",
                "gelu",
                "silu",
                "sigmoid",
                "tanh",
                "threshold",
                "clamp",
                "clamp_min",
                "clamp_max",
                "where",
                "exp",
                "log",
                "pow",
                "sqrt",
                "rsqrt",
                "neg",
                "abs",
                "dropout",
                "native_dropout",
                "bernoulli",
                "masked_fill",
                "hardtanh",
                "leaky_relu",
                "elu",
                "erf",
                "erfinv",
                "lerp",
                "lt",
                "gt",
                "eq",
                "ne",
                "ge",
                "le",
                "logical_and",
                "logical_or",
                "logical_not",
                "bitwise_and",
                "bitwise_or",
                "bitwise_not",
                "reciprocal",
                "sign",
                "floor",
                "ceil",
                "round",
                "fmod",
                "remainder",
                "maximum",
                "minimum",
                "square",
                "hardswish",
                "hardsigmoid",
                "mish",
                "softplus",
                "glu",
                "sin",
                "cos",
                "rand",
                "randn",
                "uniform",
                "normal",
                "exponential",
                "mul_scalar",
                "add_scalar",
                "isnan",
                "isinf",
                "nan_to_num",
                "sgn",
                "log1p",
                "expm1",
                "trunc",
                "frac",
                "silu_backward",
                "gelu_backward",
                "threshold_backward",
                "tanh_backward",
                "sigmoid_backward",
                "hardtanh_backward",
                "copysign",
                "heaviside",
                "xlogy",
                "addcmul_",
            )
            + r"|elementwise",
        ),
    )
)
_KERNEL_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("collective", r"nccl|all_?reduce|all_?gather|reduce_?scatter|sendrecv"),
        # Inductor's templates are GEMMs, convolutions and attention written in Triton: what
        # they compute, not who wrote them, is their kind (as cuBLAS's GEMM beside them).
        ("attention", r"triton_tem_\w*(attention|flex)"),
        ("matmul", r"triton_tem_"),
        ("compiled", r"triton|cpp_fused"),
        ("attention", r"flash|fmha|attention|attn|efficient_att|sdpa"),
        ("optimizer", r"multi_tensor_apply|foreach|fused_adam|fused_sgd|adam_|sgd_"),
        ("norm", r"norm(?!al)|bn_fw|bn_bw|batchnorm|layernorm"),
        (
            "matmul",
            # cuBLAS's and cuDNN's GEMM and convolution kernels of every generation: volta_,
            # turing_, ampere_ (sm_70 to sm_86), smNN_xmma (sm_80 to sm_100), nvjet_ (cuBLAS
            # 12.x's GEMMs on Hopper and Blackwell), CUTLASS's, and the rest by what they do.
            r"gemm|cutlass|xmma|wgmma|cublas|cudnn|conv|wgrad|dgrad|fprop|winograd|"
            r"implicit_convolve|sm\d+_xmma|ampere_|volta_|turing_|hopper_|sm\d+_|nvjet|gemv|"
            r"dot_kernel|splitk|magma",
        ),
        (
            "copy",
            r"memcpy|memset|copy|transpose|permute|cat_|catarray|index|gather|scatter|"
            r"embedding|nchw|nhwc|fill|pad_|flip|roll",
        ),
        (
            "reduction",
            r"softmax|reduce|nll_loss|cross_entropy|pool|_sum_|_mean_|max_|min_|"
            r"argmax|cumsum|scan",
        ),
        (
            "elementwise",
            r"elementwise|vectorized|unrolled|pointwise|activation|gelu|relu|"
            r"silu|sigmoid|tanh|dropout|bernoulli|threshold|clamp|addcmul|mul_|add_|div_",
        ),
    )
)
_COPY_CATEGORIES = ("gpu_memcpy", "memcpy", "gpu_memset", "memset")


def _bare(name: str) -> str:
    """An op name without its namespace and autograd wrapper, lower case:
    ``autograd::engine::evaluate_function: AddmmBackward0`` is ``addmm``."""
    text = name.strip()
    for prefix in _PREFIXES:
        if text.lower().startswith(prefix):
            text = text[len(prefix) :]
    # Autograd's node names are CamelCase: NllLossBackward0 is nll_loss's backward.
    text = _CAMEL.sub("_", text).lower()
    return _BACKWARD_SUFFIX.sub("", text).strip() or text


def classify_op(name: str) -> str | None:
    """The kind of a CPU-side op or annotation by its name; None where the name says nothing
    (the op then counts as the op it runs inside)."""
    if not name:
        return None
    text = name.strip().lower()
    if text.startswith(OPTIMIZER_PREFIX):
        return "optimizer"
    bare = _bare(name)
    for kind, pattern in _OP_RULES:
        if pattern.search(bare) or (kind in ("compiled", "host") and pattern.search(text)):
            return kind
    return None


def classify_kernel(name: str, category: str = "kernel") -> str | None:
    """The kind of a GPU event by its kernel name (copies and memsets by their category);
    None where the name says nothing."""
    if category.lower() in _COPY_CATEGORIES:
        return "copy"
    text = name.lower()
    for kind, pattern in _KERNEL_RULES:
        if pattern.search(text):
            return kind
    return None
