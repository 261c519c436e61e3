"""Fuzz campaigns against a live ``sluice serve``: ``python -m bench.fuzz <kafka|mqtt|tcp|http> --inputs N``.

``harness`` starts the broker and watches it (exit, log, fds, RSS); ``mutate`` holds the byte mutations;
one module per front door generates inputs, sends them over real sockets and checks a real client after.
"""

__all__: list[str] = []
