"""A small gRPC server over HTTP/2 for synchronous methods (the ext_proc hot path).

``wire``: pure codecs (frames, HPACK, gRPC framing); ``calls``: what a method sees of a call;
``limits``: what a connection allows a client, from ``config`` (the ``picker.http2`` section);
``protocol``: one connection's HTTP/2 state, sans I/O, composed of ``receive_windows`` (the
receiving direction's flow control), ``send_scheduler`` (what is sent against the peer's windows)
and ``budgets`` (the flood budgets); ``connection``: that protocol on an asyncio transport, with the
connection's timers; ``server``: listening, the connection limit and shutdown.
"""
