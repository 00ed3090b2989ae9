"""Offline tools: the Envoy config generator (``envoygen``), its second opinion
(``check_envoy``), what both know about routes (token endpoints, route matching,
carrier headers) and the inventory of what model servers read (``inventory``). Nothing
here runs in ``serve``."""
