"""The variants' knobs (:mod:`~ptspeed.cell.variants.knobs`) and what applies them: torch.compile,
TorchScript.
"""
