"""The HTTP prediction server and what it needs.

`.model_holder` (hot swap of the served version), `.request` (request parsing and
validation), `.batcher` (dynamic micro-batching), `.app` (the ASGI routes),
`.http` (uvicorn: ``make_server``), `.prometheus` (the server's Prometheus metrics),
`.client` (a small Python client) and `.freshness` (how fresh a served model is).
`.app` and `.http` need the serving extra (``pip install "recstream[serve]"``), so this
package imports none of them by itself.
"""
