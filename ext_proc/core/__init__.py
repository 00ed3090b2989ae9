"""The sans-IO core: what a stream of Envoy messages means and what to answer.

Plain values in, plain values out: no sockets, no gRPC, no protobuf, no clock it does
not take as an argument. The edge (``ext_proc.edge``) translates Envoy's messages into
``events`` and back; ``tests/test_layers.py`` fails when a module here imports grpc,
protobuf or anything from the edge or the tools.
"""
