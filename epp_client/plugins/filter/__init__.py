"""Filters (B2.2, B2.3, B4.7): ``filter(request, endpoints) -> list[Endpoint]``, order
preserved; the predicted-latency filters never return an empty list for a non-empty input,
the role filters may."""
