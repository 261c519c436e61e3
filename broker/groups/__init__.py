"""broker.groups"""

__all__: list[str] = []
