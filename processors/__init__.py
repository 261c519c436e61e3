"""Stream processors: pipelines, event-time watermarks, windows, state and runners."""

__all__: list[str] = []
