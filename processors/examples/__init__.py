"""Example pipelines from the lectures."""

__all__: list[str] = []
