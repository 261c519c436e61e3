"""broker.server"""

__all__: list[str] = []
