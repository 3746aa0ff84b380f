"""A cell over several processes: torchrun ranks (DDP, FSDP) and a model cut into stages (model
and pipeline parallelism, micro-batches).
"""
