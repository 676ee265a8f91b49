"""A small gRPC server over HTTP/2 for synchronous methods (the ext_proc hot path).

``wire``: pure codecs (frames, HPACK, gRPC framing); ``calls``: what a method sees of a call;
``protocol``: one connection's HTTP/2 state, sans I/O; ``connection``: that protocol on an asyncio
transport; ``server``: listening and shutdown.
"""
