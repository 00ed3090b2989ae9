"""The local stack behind ``make run``: a stand-in upstream and a process launcher."""
