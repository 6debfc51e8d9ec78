"""An OpenAI-compatible HTTP server for the engine: ``python -m executor.serve``.

The engine runs on its own thread (``live_engine.LiveEngine``): the one serving loop of
``horizon.serving_loop`` on the wall clock, fed by an ``Inbox`` that HTTP handlers post
requests and aborts to. Each step's tokens become per-request events (text deltas, finish
reasons) handed to the asyncio loop in one ``call_soon_threadsafe`` call; each request's
handler reads its own queue (``streams.StreamHub``). See ``app.py`` for the endpoints.

Importing this package pulls no web framework: ``app``, ``responses`` and ``server`` import
FastAPI and uvicorn (the ``serve`` extra).
"""
