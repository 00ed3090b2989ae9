"""The edge: the gRPC servicer, Envoy's messages and attributes, processes, keys, the
records of spent proofs, metrics and logs. It feeds the core (``ext_proc.core``) and
carries its answers out; it never imports the offline tools."""
