"""The rules: each a small function from what ``reader`` read (and, for the token
endpoints, what ``selection`` simulated) to findings. None reads the configuration in
another way than those modules, and none writes anything."""
