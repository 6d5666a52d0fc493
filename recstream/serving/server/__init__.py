"""The HTTP prediction server and what it needs.

:mod:`.model_holder` (hot swap of the served version), :mod:`.request` (request parsing and
validation), :mod:`.batcher` (dynamic micro-batching), :mod:`.app` (the ASGI routes),
:mod:`.http` (uvicorn: ``make_server``), :mod:`.prometheus` (the server's Prometheus metrics),
:mod:`.client` (a small Python client) and :mod:`.freshness` (how fresh a served model is).
:mod:`.app` and :mod:`.http` need the serving extra (``pip install "recstream[serve]"``), so this
package imports none of them by itself.
"""
