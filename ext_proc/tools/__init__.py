"""Offline tools: the Envoy config generator (``envoygen``), its second opinion
(``check_envoy``), what both know about routes (token endpoints, route matching,
carrier headers). Nothing here runs in ``serve``. The inventory of what model servers
read, the source of ext_proc/core/classified.py's lists, is a maintainer's tool outside
the package (devstack/inventory)."""
