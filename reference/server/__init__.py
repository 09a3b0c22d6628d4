"""`python -m reference serve`: an OpenAI-compatible HTTP server on the engine (vLLM's `vllm serve`, in small).

    POST /v1/completions         prompt (a text, token ids, or a list of either), vLLM's sampling fields; "stream":
                                 true sends server-sent events
    POST /v1/chat/completions    messages, rendered with the model's chat template; the same sampling fields
    GET  /v1/models, /v1/models/{id}    the one model served (another id: 404)
    POST /tokenize, /detokenize  vLLM's: a prompt or messages to token ids (count, max_model_len), ids to text
    GET  /health, /ping (also POST), /version
    GET  /metrics                Prometheus text under vLLM's names (vllm:num_requests_running, ...)
    GET  /pool                   a live page of the block pool (sim/views/pool_page.py); /pool/history its steps (JSON),
                                 /pool/events each new one (server-sent events)

One file per role, read in this order:

    requests.py       every field of vLLM's request models honoured or refused (FIELDS), checked, into SamplingParams
    engine_thread.py  the one thread that calls the engine (add, abort, step), reading it through its snapshot
    streams.py        OpenAI's response objects, whole or streamed; the open streams a shutdown ends
    metrics.py        the Prometheus series, observed from the engine's outputs and snapshots
    app.py            the routes (FastAPI)
    run.py            running it (uvicorn) and stopping it: Ctrl-C / SIGTERM end every stream at once, exit 130 / 143

The ASGI stack is FastAPI on uvicorn, the stack vLLM's own server uses.
"""
