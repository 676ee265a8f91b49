"""A small gRPC server over HTTP/2 for synchronous methods (the ext_proc hot path).

``wire``: pure codecs (frames, HPACK, gRPC framing); ``calls``: what a method sees of a call;
``limits``: what a connection allows a client (``picker.http2``) and the flood budgets' token buckets;
``protocol``: one connection's HTTP/2 state, sans I/O; ``connection``: that protocol on an asyncio
transport, with the connection's timers; ``server``: listening, the connection limit and shutdown.
"""
