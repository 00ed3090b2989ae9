"""Generated protobuf bindings (``make protos``); never edited by hand."""
