"""Offline tools: the Envoy config generator (``envoygen``), its second opinion
(``check_envoy``) and what both know about routes (token endpoints, route matching,
carrier headers). Nothing here runs in ``serve``."""
