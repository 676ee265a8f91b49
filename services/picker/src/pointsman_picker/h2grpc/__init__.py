"""A small gRPC server over HTTP/2 for synchronous methods (the ext_proc hot path)."""
