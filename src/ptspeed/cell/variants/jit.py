"""The jit knob: a model as TorchScript, called as the model spec calls the eager one.

``jit=script`` scripts the model when the step is built; ``jit=trace`` traces it on its first
call, with that call's own arguments (keywords included: the text models are called with
``input_ids=``), so the spec's loss and infer functions stay as they are. In infer mode the
TorchScript module is then frozen and optimised for inference; in train mode it is trained
unfrozen (autograd runs through it). Scripted and traced modules share their parameters
with the eager model, so the optimizer and the numerics gate see the weights it trains.

What TorchScript cannot take raises :class:`ptspeed.cell.variants.knobs.Unsupported` with the first
line of torch's reason.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ptspeed.cell.memory import is_out_of_memory
from ptspeed.errors import Unsupported

# TorchScript's profiling executor records the first call and builds the optimised graph on
# the second; a traced module's first call also holds the tracing.
ONE_OFF_CALLS = 2


class TorchScriptModel:
    """``model`` as TorchScript, ``how`` being ``script`` or ``trace``; ``freeze`` (infer mode):
    also torch.jit.freeze and torch.jit.optimize_for_inference."""

    def __init__(self, model: torch.nn.Module, how: str, freeze: bool) -> None:
        self._model = model
        self._how = how
        self._freeze = freeze
        self._output_type: type | None = None
        self._module: Any = None
        if how == "script":
            self._module = self._finish(_attempt("script", torch.jit.script, model))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._module is None:
            self._module = self._finish(self._trace(args, kwargs))
        output = self._module(*args, **kwargs)
        if isinstance(output, dict) and self._output_type not in (None, dict):
            # A traced module returns a model output class (transformers') as a plain dict.
            return self._output_type(**output)
        return output

    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        options: dict[str, Any] = {"strict": False, "check_trace": False}
        if kwargs:
            if "example_kwarg_inputs" not in inspect.signature(torch.jit.trace).parameters:
                raise Unsupported(
                    f"jit=trace: torch.jit.trace in torch {torch.__version__} takes positional "
                    f"inputs only, and the model is called with keywords ({', '.join(kwargs)}); "
                    "example_kwarg_inputs came in torch 2.0"
                )
            options["example_kwarg_inputs"] = kwargs
        outputs: list[type] = []
        hook = self._model.register_forward_hook(lambda m, i, o: outputs.append(type(o)))
        try:
            traced = _attempt("trace", torch.jit.trace, self._model, args or None, **options)
        finally:
            hook.remove()
        self._output_type = outputs[0] if outputs else None
        return traced

    def _finish(self, module: Any) -> Any:
        if not self._freeze:
            return module
        frozen = _attempt("freeze", torch.jit.freeze, module.eval())
        return _attempt("optimize_for_inference", torch.jit.optimize_for_inference, frozen)


def _attempt(what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.jit.<what>(*args)``; a model it cannot take is Unsupported with the first line
    of torch's reason (running out of memory while tracing stays an error)."""
    try:
        return function(*args, **kwargs)
    except Exception as exc:
        if is_out_of_memory(exc):
            raise
        raise Unsupported.because(f"jit: torch.jit.{what} cannot take the model", exc) from exc
