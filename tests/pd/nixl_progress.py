"""Installed into the vLLM environment of the prefill/decode tier (``pair.ensure_nixl``)
as ``ext_proc_nixl_progress``, imported at start-up by a ``.pth`` file.

nixl 1.5.1's Python agent sets the UCX progress thread's delay to 0 (``pthrDelay``),
which makes that thread ``poll()`` with a zero timeout: it spins a whole core for as
long as the server runs. vLLM's CPU backend reserves a core per server for it; on a
machine without one to spare (two servers on two cores) the spinning threads starve the
engines, and a prefill server whose progress thread or engine does not run serves a
decode server's read late (seconds, up to its block lease). With
``EXT_PROC_NIXL_PROGRESS_DELAY_US`` set, every agent this process creates gets that
delay: the thread then sleeps in ``poll()`` until UCX signals work or the delay passes.
Without the variable nothing is imported or changed.
"""

import os

_DELAY = os.environ.get("EXT_PROC_NIXL_PROGRESS_DELAY_US")


def _install(delay_us: int) -> None:
    # Imported only where the variable asks for it: in the vLLM environment's servers.
    import nixl  # noqa: F401, PLC0415  (puts the platform's nixl._api in place)
    from nixl import _api  # noqa: PLC0415

    create = _api.nixlBind.nixlAgent

    def agent(name, config):  # type: ignore[no-untyped-def]
        config.pthrDelay = delay_us
        return create(name, config)

    _api.nixlBind.nixlAgent = agent


if _DELAY:
    _install(int(_DELAY))
