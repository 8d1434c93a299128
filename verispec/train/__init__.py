"""``verispec train-drafter``: self-distillation of the trained drafters (``head``, ``block``).

Pipeline, one module each: ``prompts`` (training prompts written here, never the benchmark's)
-> ``data`` (the target answers them; its hidden states are cached as safetensors) ->
``objectives`` (per kind: the network, batches and loss) -> ``loop`` (optimiser,
checkpoints, loss curve, export) -> ``cli``.
"""
