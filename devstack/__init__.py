"""The local stack behind ``make run``: a stand-in upstream and the process launcher.

A development tool, run from the checkout (``python -m devstack``); not part of the
runtime package.
"""
