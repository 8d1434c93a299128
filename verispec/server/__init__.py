"""``verispec serve``: an OpenAI-compatible HTTP server over one engine.

Modules: ``schemas`` (request/response bodies), ``errors`` (the one error shape),
``metrics`` (Prometheus), ``worker`` (the engine thread and its bounded queue), ``app``
(routes and the request gate), ``runner`` (uvicorn with a draining shutdown), ``cli``.
Importing this package imports none of them, so the command line stays fast.
"""
