"""``verispec batch``: a file of requests in the OpenAI Batch API's input format, run through
the server's own path, answered in that API's output format.

- ``reading``: the input file, its lines checked up front (each bad one named by number);
- ``records``: the output lines (a response, or an error the server would have answered);
- ``writer``: the output file, append-only and resumable (a rerun skips what it holds);
- ``runner``: requests on one engine, many at once, through the server's engine worker;
- ``ray_job``: the same job as a Ray Data pipeline over an actor pool of engines;
- ``progress``: the progress bar and the summary, fed by the records;
- ``cli``: the subcommand.

Terms: a *request* is one input line (``custom_id``, ``method``, ``url``, ``body``); its
*record* is its output line (``id``, ``custom_id``, ``response`` {``status_code``,
``request_id``, ``body``}, ``error``).
"""
