"""verispec's own decoder for the Llama family: weights read straight from GGUF or
safetensors in their quantised formats, a preallocated KV cache written in place, and C++
kernels whose rows are bit-identical to single decode steps (``decoder.py`` says how the
pieces fit; ``targets/native.py`` puts it behind the Target protocol)."""
