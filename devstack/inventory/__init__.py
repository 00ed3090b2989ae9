"""What the model servers behind the gateway read, generated from their own sources: the
wheel reader (``wheels``) and the stacks snapshot (``stacks``) write one inventory
(``model``), which the hand-kept classification is keyed by. A maintainer's tool, run
from the checkout and not in the wheel: the processor takes only what
``python -m devstack classified`` generates from it (ext_proc/core/classified.py,
declared.json); ``python -m devstack.inventory`` rebuilds and reports it."""
