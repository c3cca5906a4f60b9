"""Cost: what services' replicas cost over a window, per request and per row, and the
forecast of the next days' spend (``inferway report cost``)."""
