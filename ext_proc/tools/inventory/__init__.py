"""What the model servers behind the gateway read, generated from their own sources: the
wheel reader (``wheels``) and the stacks snapshot (``stacks``) write one inventory
(``model``), which the hand-kept classification is keyed by. Nothing here runs in
``serve``; ``python -m ext_proc.tools.inventory`` rebuilds and reports it."""
