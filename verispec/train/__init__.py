"""``verispec train-drafter`` and ``verispec train-data``: self-distillation of the trained
drafters (``head``, ``block``).

Data, one module each: ``sources`` (prompt sources: templates, roleplay, standard-library
passages and code, maths, questions the target writes; ``held_out`` the eval prompts, from
material the sources never use) -> ``shards`` (a data directory that grows: the target's
answers by batched native generation, resumable; ``data_cli`` its command; ``states`` its
hidden states, read in place from each shard's file) or ``data`` (a set generated in one go,
and the hidden-state cache). Training: ``objectives`` (per kind: the
network, batches and loss) -> ``loop`` (optimiser, checkpoints, loss curve, export), with
``score`` (the held-out score: the drafter's greedy chains along the target's answers to the
eval prompts, at every checkpoint) -> ``pipeline`` -> ``cli``.
"""
