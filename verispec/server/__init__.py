"""``verispec serve``: an OpenAI-compatible HTTP server over one engine.

Modules: ``schemas`` (request/response bodies), ``errors`` (the one error shape),
``metrics`` (Prometheus), ``worker`` (the engine thread and its bounded queue), ``state``
(settings and live state), ``gate`` (the ASGI gate: hosts, drain, API keys, body limits;
CORS), ``jobs`` (request bodies into jobs), ``exchange`` (a job run into JSON or SSE),
``responses`` (bodies and chunks from ``schemas``), ``openapi`` (the document), ``app``
(the app and its routes), ``runner`` (uvicorn with a draining shutdown), ``cli``.
Importing this package imports none of them, so the command line stays fast.
"""
