"""``verispec bench``: configurations side by side on one model and one prompt set.

Layers: ``configs`` parses what to run, ``runners`` run one prompt per configuration and
return a record, ``run`` interleaves them and writes the JSON, ``report`` turns records into
the per-category table (every ratio through ``rounds.py``), ``plots`` draws the PNGs.
"""
