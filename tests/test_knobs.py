"""Variant knobs: the grammar, its error messages, and what a torch/device can run."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptspeed.cell.variants.knobs import (
    AMP_DTYPES,
    ATTENTION_IMPLEMENTATIONS,
    COMPILE_MODES,
    JIT_MODES,
    KNOB_NAMES,
    Knobs,
    parse_knobs,
)
from ptspeed.cell.variants.support import unsupported_for_model, unsupported_reason
from ptspeed.errors import BadInput
from ptspeed.models import get_model

ACCEPTED_TEXT = re.compile(r"[a-z0-9_.=+-]+")
BACKENDS = ("inductor", "eager", "aot_eager", "cudagraphs")


def render(knobs: Knobs) -> list[str]:
    """The knob tokens that stand for ``knobs`` (the inverse of parsing, up to order)."""
    tokens = []
    if knobs.compile_mode is not None:
        mode = knobs.compile_mode
        tokens.append("compile" if mode == "default" else f"compile={mode}")
        if knobs.compile_backend != "inductor":
            tokens.append(f"backend={knobs.compile_backend}")
    if knobs.amp is not None:
        tokens.append("amp" if knobs.amp == "auto" else f"amp={knobs.amp}")
    tokens += [name for name in ("channels_last", "cudagraphs") if getattr(knobs, name)]
    if knobs.loader_workers is not None:
        tokens.append(f"loader={knobs.loader_workers}")
        if knobs.pin_memory:
            tokens.append("pin")
        tokens += ["prefetch"] * knobs.prefetch + ["persistent"] * knobs.persistent_workers
        if knobs.prefetch_factor is not None:
            tokens.append(f"prefetch_factor={knobs.prefetch_factor}")
    tokens += [f"{name}={getattr(knobs, name)}" for name in ("jit", "attn") if getattr(knobs, name)]
    if knobs.memory_fraction is not None:
        tokens.append(f"memfrac={knobs.memory_fraction!r}")
    if knobs.parallel is not None:
        tokens.append("fsdp=offload" if knobs.cpu_offload else knobs.parallel)
        tokens.append(f"procs={knobs.processes}")
    return tokens or ["eager"]


@st.composite
def valid_knobs(draw: st.DrawFn) -> Knobs:
    compiled = draw(st.booleans())
    cudagraphs = draw(st.booleans())
    loader = draw(st.none() | st.integers(0, 64))
    pin = loader is not None and draw(st.booleans())
    workers = loader is not None and loader >= 1
    parallel = draw(st.none() | st.sampled_from(["ddp", "fsdp"]))
    return Knobs(
        compile_mode=draw(st.sampled_from(COMPILE_MODES)) if compiled else None,
        compile_backend=draw(st.sampled_from(BACKENDS)) if compiled else "inductor",
        amp=draw(st.none() | st.sampled_from(AMP_DTYPES)),
        channels_last=draw(st.booleans()),
        cudagraphs=cudagraphs,
        loader_workers=loader,
        pin_memory=pin,
        memory_fraction=draw(st.none() | st.floats(1e-6, 1.0)),
        parallel=parallel,
        cpu_offload=parallel == "fsdp" and draw(st.booleans()),
        processes=draw(st.integers(1, 64)) if parallel else 1,
        jit=None if compiled or cudagraphs else draw(st.none() | st.sampled_from(JIT_MODES)),
        attn=draw(st.none() | st.sampled_from(ATTENTION_IMPLEMENTATIONS)),
        prefetch=pin and draw(st.booleans()),
        prefetch_factor=draw(st.none() | st.integers(1, 64)) if workers else None,
        persistent_workers=workers and draw(st.booleans()),
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("eager", Knobs()),
        (" eager ", Knobs()),
        ("compile", Knobs(compile_mode="default")),
        (
            "compile=max-autotune+backend=aot_eager",
            Knobs(compile_mode="max-autotune", compile_backend="aot_eager"),
        ),
        ("backend=eager+compile", Knobs(compile_mode="default", compile_backend="eager")),
        ("amp", Knobs(amp="auto")),
        ("amp=bf16+channels_last", Knobs(amp="bf16", channels_last=True)),
        ("cudagraphs", Knobs(cudagraphs=True)),
        ("loader", Knobs(loader_workers=0)),
        ("loader=2+pin", Knobs(loader_workers=2, pin_memory=True)),
        ("memfrac=0.8", Knobs(memory_fraction=0.8)),
        ("memfrac=1", Knobs(memory_fraction=1.0)),
        ("ddp", Knobs(parallel="ddp", processes=2)),
        ("fsdp+procs=4", Knobs(parallel="fsdp", processes=4)),
        ("procs=1+fsdp=offload", Knobs(parallel="fsdp", cpu_offload=True, processes=1)),
        ("ddp+compile+amp=bf16", Knobs("default", amp="bf16", parallel="ddp", processes=2)),
        ("jit=script", Knobs(jit="script")),
        ("jit=trace+amp=bf16+channels_last", Knobs(jit="trace", amp="bf16", channels_last=True)),
        ("attn=sdpa", Knobs(attn="sdpa")),
        ("attn=eager+compile", Knobs("default", attn="eager")),
        ("loader=2+pin+prefetch", Knobs(loader_workers=2, pin_memory=True, prefetch=True)),
        ("loader=0+pin+prefetch", Knobs(loader_workers=0, pin_memory=True, prefetch=True)),
        ("loader=1+prefetch_factor=4", Knobs(loader_workers=1, prefetch_factor=4)),
        ("persistent+loader=3", Knobs(loader_workers=3, persistent_workers=True)),
    ],
)
def test_grammar_examples(text: str, expected: Knobs) -> None:
    assert parse_knobs(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty (accepted knobs: eager, compile"),
        ("   ", "empty"),
        ("amp+amp=bf16", "'amp' given twice"),
        ("compile+compile=max-autotune", "'compile' given twice"),
        ("turbo", "unknown knob 'turbo' (accepted: eager, compile"),
        ("compile=fast", "compile=fast is not one of default, reduce-overhead"),
        ("amp=fp8", "amp=fp8 is not one of auto, fp16, bf16"),
        ("loader=-1", "loader=-1 must be an integer from 0 to 64"),
        ("loader=65", "must be an integer from 0 to 64"),
        ("loader=two", "must be an integer"),
        ("memfrac=0", "memfrac=0 must be a number in (0, 1]"),
        ("memfrac=1.5", "must be a number in (0, 1]"),
        ("memfrac=nan", "must be a number in (0, 1]"),
        ("memfrac", "must be a number in (0, 1]"),
        ("backend", "backend needs a value"),
        ("backend=eager", "backend= needs compile"),
        ("pin", "pin needs loader"),
        ("eager+amp", "eager cannot be combined"),
        ("channels_last=yes", "channels_last takes no value"),
        ("AMP", "'AMP' is not name or name=value"),
        ("amp++compile", "'' is not name or name=value"),
        ("amp = bf16", "is not name or name=value"),
        ("memfrac=0.5\n+amp", "is not name or name=value"),
        ("compile+backend=eager\n+amp", "is not name or name=value"),
        ("procs=2", "procs needs ddp or fsdp"),
        ("amp+procs=4", "procs needs ddp or fsdp"),
        ("ddp+fsdp", "ddp and fsdp cannot be combined"),
        ("ddp+procs=0", "procs=0 must be an integer from 1 to 64"),
        ("fsdp+procs=65", "procs=65 must be an integer from 1 to 64"),
        ("ddp+procs", "procs= must be an integer"),
        ("fsdp=cpu", "fsdp=cpu is not one of offload"),
        ("ddp=2", "ddp takes no value"),
        ("ddp+ddp", "'ddp' given twice"),
        ("jit", "jit= is not one of script, trace"),
        ("jit=fast", "jit=fast is not one of script, trace"),
        ("jit=script+compile", "jit and compile cannot be combined"),
        ("compile=max-autotune+jit=trace", "jit and compile cannot be combined"),
        ("jit=trace+cudagraphs", "jit and cudagraphs cannot be combined"),
        ("attn", "attn= is not one of sdpa, eager"),
        ("attn=flash", "attn=flash is not one of sdpa, eager"),
        ("prefetch", "prefetch needs loader=N and pin"),
        ("loader=2+prefetch", "prefetch needs loader=N and pin"),
        ("loader=2+pin+prefetch=2", "prefetch takes no value"),
        ("prefetch_factor=2", "prefetch_factor needs loader=N with N >= 1 workers"),
        ("loader=0+prefetch_factor=2", "prefetch_factor needs loader=N with N >= 1 workers"),
        ("loader=2+prefetch_factor=0", "prefetch_factor=0 must be an integer from 1 to 64"),
        ("loader=2+prefetch_factor=65", "prefetch_factor=65 must be an integer from 1 to 64"),
        ("loader=2+prefetch_factor", "prefetch_factor= must be an integer"),
        ("persistent", "persistent needs loader=N with N >= 1 workers"),
        ("loader+persistent", "persistent needs loader=N with N >= 1 workers"),
        ("loader=1+persistent=yes", "persistent takes no value"),
    ],
)
def test_bad_knobs_are_refused_with_one_clear_line(text: str, fragment: str) -> None:
    with pytest.raises(BadInput) as caught:
        parse_knobs(text)
    message = str(caught.value)
    assert message.startswith("knobs: ")
    assert fragment in message
    assert "\n" not in message


@given(valid_knobs(), st.randoms())
def test_rendered_knobs_parse_back_in_any_order(knobs: Knobs, rng: random.Random) -> None:
    tokens = render(knobs)
    rng.shuffle(tokens)
    assert parse_knobs("+".join(tokens)) == knobs


@given(st.text() | st.text(alphabet="abcdefgilmnoprstuvxz0123456789_=.+- \n\t", max_size=40))
def test_any_text_parses_or_is_refused_as_bad_input(text: str) -> None:
    try:
        knobs = parse_knobs(text)
    except BadInput as exc:
        assert str(exc).startswith("knobs: ")
        assert "\n" not in str(exc)
    else:
        assert isinstance(knobs, Knobs)
        assert ACCEPTED_TEXT.fullmatch(text.strip())


@given(st.lists(st.sampled_from([*KNOB_NAMES, "amp=bf16", "loader=2", "memfrac=0.5"]), max_size=5))
def test_combinations_of_valid_tokens_parse_or_are_refused(tokens: list[str]) -> None:
    try:
        knobs = parse_knobs("+".join(tokens))
    except BadInput as exc:
        assert str(exc).startswith("knobs: ")
    else:
        assert knobs.is_eager_fp32 == (tokens == ["eager"])


def test_precision_of_amp_depends_on_the_device() -> None:
    assert Knobs().precision("cuda") == "fp32"
    assert Knobs(amp="auto").precision("cuda") == "fp16"
    assert Knobs(amp="auto").precision("cpu") == "bf16"
    assert Knobs(amp="fp16").precision("cpu") == "fp16"
    assert Knobs().is_eager_fp32
    assert not Knobs(loader_workers=0).is_eager_fp32


def reason(
    text: str,
    device: str = "cuda",
    torch_version: tuple[int, int] = (2, 5),
    python: tuple[int, int] = (3, 11),
    image_model: bool = True,
) -> str:
    return unsupported_reason(parse_knobs(text), device, torch_version, python, image_model)


@pytest.mark.parametrize(
    ("text", "device", "torch_version", "python", "image_model", "fragment"),
    [
        ("compile", "cuda", (1, 13), (3, 10), True, "PyTorch >= 2.0 (this environment has 1.13)"),
        ("compile", "cpu", (1, 13), (3, 10), True, "needs PyTorch >= 2.0"),
        ("compile", "cuda", (2, 0), (3, 11), True, "supports Python <= 3.10"),
        ("compile+cudagraphs", "cuda", (2, 1), (3, 11), True, "use compile=reduce-overhead"),
        ("amp=fp16", "cpu", (2, 5), (3, 11), True, "needs a CUDA device (this cell runs on cpu)"),
        ("cudagraphs", "cpu", (2, 5), (3, 11), True, "cudagraphs needs a CUDA device"),
        ("loader=2+pin", "cpu", (2, 5), (3, 11), True, "pin (pinned host memory) needs a CUDA"),
        ("memfrac=0.8", "cpu", (2, 5), (3, 11), True, "memfrac"),
        ("cudagraphs+amp", "cuda", (2, 5), (3, 11), True, "GradScaler"),
        ("channels_last", "cuda", (2, 5), (3, 11), False, "image models"),
        ("channels_last", "cpu", (1, 13), (3, 10), False, "image models"),
        ("loader=2+pin+prefetch", "cpu", (2, 5), (3, 11), True, "prefetch (host-to-device"),
        ("jit=script+ddp", "cpu", (2, 5), (3, 11), True, "jit with ddp: ptspeed makes"),
        ("jit=trace+fsdp", "cuda", (2, 5), (3, 11), True, "jit with fsdp"),
    ],
)
def test_unsupported_combinations_are_named(
    text: str,
    device: str,
    torch_version: tuple[int, int],
    python: tuple[int, int],
    image_model: bool,
    fragment: str,
) -> None:
    assert fragment in reason(text, device, torch_version, python, image_model)


@pytest.mark.parametrize(
    ("text", "device", "torch_version", "python", "image_model"),
    [
        ("eager", "cpu", (1, 13), (3, 10), False),
        ("compile", "cuda", (2, 0), (3, 10), True),
        ("compile=max-autotune+backend=aot_eager", "cpu", (2, 1), (3, 11), False),
        ("amp=fp16", "cuda", (1, 13), (3, 10), True),
        ("amp", "cuda", (2, 0), (3, 10), True),
        ("amp", "cpu", (2, 5), (3, 11), False),
        ("amp=bf16", "cpu", (1, 13), (3, 10), False),
        ("cudagraphs", "cuda", (2, 5), (3, 11), True),
        ("cudagraphs+amp=bf16", "cuda", (2, 5), (3, 11), True),
        ("loader=2+pin+memfrac=0.8", "cuda", (1, 13), (3, 10), True),
        ("loader=2", "cpu", (2, 5), (3, 11), False),
        ("channels_last", "cpu", (2, 5), (3, 11), True),
        ("jit=script", "cpu", (1, 13), (3, 10), False),
        ("jit=trace+amp=bf16+channels_last", "cpu", (2, 0), (3, 10), True),
        ("loader=2+pin+prefetch+prefetch_factor=4+persistent", "cuda", (1, 13), (3, 10), True),
        ("loader=1+persistent+prefetch_factor=1", "cpu", (2, 5), (3, 11), False),
    ],
)
def test_supported_combinations_have_no_reason(
    text: str,
    device: str,
    torch_version: tuple[int, int],
    python: tuple[int, int],
    image_model: bool,
) -> None:
    assert reason(text, device, torch_version, python, image_model) == ""


@pytest.mark.parametrize("knobs", ["attn=sdpa", "attn=eager", "attn=sdpa+compile"])
def test_attn_applies_to_attention_models_only(knobs: str) -> None:
    on_text = unsupported_reason(parse_knobs(knobs), "cpu", (2, 5), (3, 11), False, True)
    on_image = unsupported_reason(parse_knobs(knobs), "cpu", (2, 5), (3, 11), True, False)
    assert on_text == ""
    assert on_image == "attn applies to models with transformers' attention (the text models) only"


@pytest.mark.parametrize(
    ("knobs", "device", "own"),
    [
        ("compile", "cpu", True),
        ("cudagraphs", "cuda", True),
        ("jit=script", "cpu", False),
        ("jit=trace", "cuda", True),
        ("attn=sdpa", "cpu", False),
        ("attn=sdpa", "cuda", True),
        ("attn=eager", "cuda", False),
        ("amp", "cuda", False),
    ],
)
def test_which_variants_draw_their_own_random_numbers(knobs: str, device: str, own: bool) -> None:
    assert parse_knobs(knobs).draws_own_random(device) is own


def test_the_reference_of_an_attn_variant_has_eager_attention() -> None:
    assert parse_knobs("attn=sdpa").reference_attention == "eager"
    assert parse_knobs("attn=eager+amp").reference_attention == "eager"
    assert parse_knobs("compile").reference_attention is None


@pytest.mark.parametrize(
    ("model", "knobs", "torch_version", "fragment"),
    [
        ("bert-tiny", "cudagraphs", (2, 14), "cudagraphs with transformers' SDPA attention"),
        ("bert-base", "cudagraphs+attn=sdpa", (2, 5), "attention-mask check reads the device"),
        ("mask-rcnn", "cudagraphs", (2, 14), "shapes depend on its data"),
        ("mlp", "compile=max-autotune-no-cudagraphs", (2, 0), "needs PyTorch >= 2.1"),
    ],
)
def test_what_fails_for_a_known_reason_is_unsupported_before_it_runs(
    model: str, knobs: str, torch_version: tuple[int, int], fragment: str
) -> None:
    """Each of these failed (a capture error, 'Unrecognized mode') and was recorded as failed."""
    reason = unsupported_for_model(parse_knobs(knobs), "cuda", torch_version, (3, 10),
                                   get_model(model))  # fmt: skip
    assert fragment in reason


@pytest.mark.parametrize(
    ("model", "knobs", "torch_version"),
    [
        ("bert-tiny", "cudagraphs+attn=eager", (2, 14)),  # no mask check on the host
        ("bert-tiny", "cudagraphs", (2, 0)),  # transformers' default there is eager attention
        ("gpt2-tiny", "cudagraphs", (2, 14)),  # no attention mask given: no check
        ("mlp", "compile=max-autotune-no-cudagraphs", (2, 1)),
    ],
)
def test_the_same_knobs_elsewhere_are_supported(
    model: str, knobs: str, torch_version: tuple[int, int]
) -> None:
    assert unsupported_for_model(parse_knobs(knobs), "cuda", torch_version, (3, 10),
                                 get_model(model)) == ""  # fmt: skip


def test_cudagraphs_with_a_loader_needs_a_thread_local_capture() -> None:
    reason = unsupported_reason(parse_knobs("cudagraphs+loader=2"), "cuda", (2, 0), (3, 10), False)
    assert "needs PyTorch >= 2.1" in reason and "thread_local" in reason
    knobs = parse_knobs("cudagraphs+loader=2+pin")
    assert unsupported_reason(knobs, "cuda", (2, 1), (3, 10), False) == ""
